"""Never silently wrong: no bare NaN / Infinity in any JSON grpolab writes, non-finite reward totals and
over-large ints are errors, YAML integers read as written, merge keys work, huge seeds are refused."""

from __future__ import annotations

import json
import math

import pytest

from grpolab import jsonio
from grpolab.config import ConfigError, load_config
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


@pytest.mark.parametrize(
    ("override", "key", "value"),
    [
        ("train.num_steps=010", ("train", "num_steps"), 10),  # YAML 1.1 read 8 (octal)
        ("train.num_steps=0o10", ("train", "num_steps"), 8),  # an explicit base still works
        ("train.num_steps=0x10", ("train", "num_steps"), 16),
        ("train.num_steps=1_000", ("train", "num_steps"), 1000),
        ("seed=-007", ("seed",), -7),
        ("optim.lr=1e-5", ("optim", "lr"), 1e-5),
        ("log.run_name=1:30", ("log", "run_name"), "1:30"),  # YAML 1.1 read 90 (sexagesimal)
    ],
)
def test_yaml_numbers_read_as_written(override, key, value):
    cfg = load_config(None, [override])
    got = cfg
    for part in key:
        got = getattr(got, part)
    assert got == value and type(got) is type(value)


def test_yaml_integers_in_a_file_and_merge_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "train: {num_steps: 010, prompts_per_step: 04}\n"
        "reward:\n"
        "  functions:\n"
        "    - &em {name: exact_match, weight: 2.0}\n"
        "    - {<<: *em, alias: em_half, weight: 0.5}\n"
    )
    cfg = load_config(path)
    assert (cfg.train.num_steps, cfg.train.prompts_per_step) == (10, 4)
    first, second = cfg.reward.functions
    assert (first.name, first.weight, first.alias) == ("exact_match", 2.0, None)
    assert (second.name, second.weight, second.alias) == ("exact_match", 0.5, "em_half")  # explicit key wins
    path.write_text("algo: {beta: 0.1, beta: 0.2}\n")
    with pytest.raises(ConfigError, match="key 'beta' is given twice"):  # duplicates are still refused
        load_config(path)


def test_huge_integers_and_seeds_are_config_errors():
    with pytest.raises(ConfigError, match="seed=100000000000000000000 is too large"):
        load_config(None, ["seed=100000000000000000000"])
    with pytest.raises(ConfigError, match=r"config key 'train.num_steps' is an integer of 30 digits"):
        load_config(None, ["train.num_steps=" + "9" * 30])
    assert load_config(None, ["seed=9223372036854000000"]).seed == 9223372036854000000  # 63 bits still fit


def test_a_seed_near_the_limit_shuffles():
    from grpolab.data import PromptSampler

    sampler = PromptSampler(10, seed=9223372036854000000)
    assert sorted(sampler.next(10)) == list(range(10))
    assert PromptSampler(10, seed=-5).next(10) == PromptSampler(10, seed=-5).next(10)
