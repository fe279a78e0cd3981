"""No bare NaN / Infinity in the metrics, samples and eval JSON grpolab writes (runtime/logging.py,
eval/results.py)."""

from __future__ import annotations

import json
import math

import pytest

from grpolab.eval.results import ModelEval, load_evals, save_evals
from grpolab.runtime.logging import RunLogger


def _strict(text: str):
    """json.loads that fails on NaN / Infinity, as jq and JavaScript do."""
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name} in JSON"))


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
