"""Never silently wrong: no bare NaN / Infinity in any JSON grpolab writes, non-finite reward totals and
over-large ints are errors, a seed near the limit shuffles. (YAML numbers and merge keys: config/test_loading.py;
huge integers and seeds: config/test_checks.py.)"""

from __future__ import annotations

import json
import math

import pytest

from grpolab import jsonio
from grpolab.config import ConfigError
from grpolab.eval.results import ModelEval, load_evals, save_evals
from grpolab.rewards import RewardError, WeightedReward, per_sample, score_batch
from grpolab.runtime.logging import RunLogger
from grpolab.types import Completion, Example


def _strict(text: str):
    """json.loads that fails on NaN / Infinity, as jq and JavaScript do."""
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name} in JSON"))


def test_dumps_writes_null_for_every_non_finite_float_and_counts_them():
    row = {"a": math.nan, "b": [1.0, math.inf, {"c": -math.inf}], "d": 2, "e": "x"}
    assert jsonio.finite(row) == ({"a": None, "b": [1.0, None, {"c": None}], "d": 2, "e": "x"}, 3)
    assert _strict(jsonio.dumps_row(row)) == {"a": None, "b": [1.0, None, {"c": None}], "d": 2, "e": "x",
                                              "nonfinite_count": 3}
    assert "nonfinite_count" not in _strict(jsonio.dumps_row({"a": 1.5}))


def test_loads_strict_refuses_duplicate_keys_and_nan():
    with pytest.raises(jsonio.DuplicateKey, match="key 'a' is given twice"):
        jsonio.loads_strict('{"a": 1, "b": {"a": 2}, "a": 3}')
    with pytest.raises(ValueError, match="NaN is not a JSON number"):
        jsonio.loads_strict('{"a": NaN}')
    assert math.isnan(jsonio.loads_strict('{"a": NaN}', allow_nan=True)["a"])


def test_metrics_samples_and_eval_json_hold_no_bare_nan(tmp_path):
    logger = RunLogger(tmp_path, tensorboard=False)
    logger.log(1, {"train/reward_mean": math.nan, "loss/kl": math.inf, "x": 0.5})
    logger.samples(1, [{"prompt": "p", "reward": math.nan, "advantage": -math.inf}])
    logger.close()
    metrics = [_strict(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert metrics == [{"step": 1, "train/reward_mean": None, "loss/kl": None, "x": 0.5, "nonfinite_count": 2}]
    samples = [_strict(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert samples[0]["reward"] is None and samples[0]["nonfinite_count"] == 2
    e = ModelEval("m", "p", 1, 1, 1.0, {1: 0.5}, {1: 0.5}, gold_mean={"gold": math.nan})
    save_evals([e], tmp_path / "eval.json")
    assert _strict((tmp_path / "eval.json").read_text())[0]["gold_mean"] == {"gold": None}
    assert math.isnan(load_evals(tmp_path / "eval.json")[0].gold_mean["gold"])


def _score(value, weight=1.0):
    reward = per_sample(lambda c, e: value, name="r")
    ex, comp = Example(prompt="p", answer="a"), Completion(text="x", num_tokens=1)
    return score_batch([WeightedReward(reward, weight)], [comp], [ex], timeout_s=None)


def test_non_finite_totals_and_huge_ints_are_reward_errors():
    assert _score(0.5, 2.0).total == [1.0]
    with pytest.raises(RewardError, match=r"the total reward of example 0 .* is inf \(10 x 1e\+308 \('r'\)\)"):
        _score(1e308, 10.0)
    with pytest.raises(RewardError, match="reward 'r' returned an int of 401 digits for example 0"):
        _score(10**400)
    for weight in (math.nan, math.inf, 10**400):
        with pytest.raises(ConfigError, match="give a finite number"):
            WeightedReward(per_sample(lambda c, e: 1.0, name="r"), weight)


def test_a_seed_near_the_limit_shuffles():
    from grpolab.data import PromptOrder

    sampler = PromptOrder(10, seed=9223372036854000000)
    assert sorted(sampler.next(10)) == list(range(10))
    assert PromptOrder(10, seed=-5).next(10) == PromptOrder(10, seed=-5).next(10)
