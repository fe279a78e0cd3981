"""Each reward function's rewards apart (training/batch.py ``reward_parts``) and the GDPO estimator the
trainer picks for algo.advantage=gdpo."""

import pytest
import torch

from grpolab.algo.gdpo import gdpo_advantages
from grpolab.config import load_config
from grpolab.training.batch import outcome_estimator, reward_parts


def test_reward_parts_are_the_components_in_prompt_major_order_with_their_weights():
    components = {"acc": [1.0, 0.0, None, 1.0], "fmt": [0.5, None, 0.5, 0.0]}
    parts = reward_parts(components, {"fmt": 0.25, "acc": 2.0}, (2, 2))
    assert parts.values.tolist() == [[[1.0, 0.5], [0.0, 0.0]], [[0.0, 0.5], [1.0, 0.0]]]
    assert parts.valid.tolist() == [[[True, True], [True, False]], [[False, True], [True, True]]]
    assert parts.weights.tolist() == [2.0, 0.25]


def test_the_gdpo_estimator_reads_the_parts_and_repeats_each_advantage_along_t():
    cfg = load_config(None, ["algo.advantage=gdpo"])
    components = {"acc": [1.0, 0.0, 1.0, 1.0], "fmt": [0.0, 1.0, 1.0, 0.0]}
    parts = reward_parts(components, {"acc": 1.0, "fmt": 0.5}, (2, 2))
    totals = torch.tensor([[1.0, 0.5], [1.5, 1.0]])
    mask = torch.tensor([[True, True, False], [True, False, False], [True, True, True], [True, False, False]])
    valid = torch.ones(2, 2, dtype=torch.bool)
    a = cfg.algo
    estimator = outcome_estimator(a.advantage, std=a.std, eps=a.eps, beta=a.beta, gamma=a.gamma)
    out = estimator(totals, valid, mask, None, parts=parts)
    want = gdpo_advantages(parts.values, parts.valid, parts.weights).reshape(-1, 1) * mask
    torch.testing.assert_close(out, want)
    assert out[0, 0] > 0 > out[1, 0]  # group 0: acc decides; group 1: fmt decides (half weight)
    with pytest.raises(ValueError, match="pass parts"):
        estimator(totals, valid, mask, None)
