"""Rollout correction (algo/correction.py) pinned to hand-computed numbers."""

import itertools
import math

import pytest
import torch

from grpolab.algo.correction import mismatch_sums, rollout_correction_weights


def close(actual, expected, **kw):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), **kw)


# trainer log-probs 0.6 and 0.3, sampler's 0.2 and 0.4: weights 3 and 0.75 (product 2.25)
OLD = torch.log(torch.tensor([[0.6, 0.3]]))
SAMPLER = torch.log(torch.tensor([[0.2, 0.4]]))
ALL = torch.ones(1, 2, dtype=torch.bool)


@pytest.mark.parametrize(
    ("mode", "level", "expected"),
    [
        ("tis", "token", [[2.0, 0.75]]),
        ("mis", "token", [[0.0, 0.75]]),
        ("tis", "sequence", [[2.0, 2.0]]),
        ("mis", "sequence", [[0.0, 0.0]]),
    ],
)
def test_rollout_correction_weights_pinned(mode, level, expected):
    w = rollout_correction_weights(OLD, SAMPLER, ALL, mode=mode, level=level, cap=2.0)
    close(w, expected, atol=1e-6, rtol=0)


def test_rollout_correction_is_one_when_sampler_agrees_and_zero_outside_mask():
    mask = torch.tensor([[True, False]])
    for mode, level in itertools.product(("tis", "mis"), ("token", "sequence")):
        w = rollout_correction_weights(OLD, OLD, mask, mode=mode, level=level)
        assert torch.equal(w, torch.tensor([[1.0, 0.0]]))


def test_mismatch_sums_pinned():
    sums = mismatch_sums(OLD, SAMPLER, ALL)
    assert sums["sampler_abs_diff"] == pytest.approx(math.log(3) + abs(math.log(0.75)), abs=1e-5)
    # k3 of KL(sampler || trainer): x = pi_train / pi_sampler -> x - log x - 1
    k3 = (3 - math.log(3) - 1) + (0.75 - math.log(0.75) - 1)
    assert sums["sampler_kl"] == pytest.approx(k3, abs=1e-5)
