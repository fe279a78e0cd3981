"""CISPO (algo/losses.py) pinned to hand-computed numbers: it clips the weight, not the gradient."""

import math

import pytest
import torch

from grpolab.algo.losses import POLICY_LOSSES, cispo_loss, clipped_surrogate_loss


def _one_token(loss_fn, logp: float, old_logp: float, adv: float, **kw):
    lp = torch.tensor([[logp]], requires_grad=True)
    out = loss_fn(lp, torch.tensor([[old_logp]]), torch.tensor([adv]), **kw)
    out.loss.sum().backward()
    return float(out.loss.detach()), float(lp.grad), bool(out.clipped_low), bool(out.clipped_high)


def test_cispo_clips_the_weight_not_the_gradient():
    # MiniMax-M1 Eq. 4: -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log pi.
    # ratio 0.5 / 0.25 = 2, clipped to 1.5; A = +1: loss -1.5 * log 0.5, gradient -1.5 (still flows)
    loss, grad, _, high = _one_token(cispo_loss, math.log(0.5), math.log(0.25), 1.0, clip_low=1.0, clip_high=0.5)
    assert loss == pytest.approx(-1.5 * math.log(0.5)) and grad == pytest.approx(-1.5) and high
    # the PPO clip drops that token's gradient entirely
    _, ppo_grad, _, _ = _one_token(clipped_surrogate_loss, math.log(0.5), math.log(0.25), 1.0, clip_high=0.5)
    assert ppo_grad == 0.0
    # ratio 0.5 with A = -1 and eps_low 0.2: weight 0.8, gradient +0.8
    loss, grad, low, _ = _one_token(cispo_loss, math.log(0.25), math.log(0.5), -1.0, clip_low=0.2, clip_high=0.5)
    assert loss == pytest.approx(0.8 * math.log(0.25)) and grad == pytest.approx(0.8) and low
    # inside the range the weight is the ratio itself: 1.2 * A
    _, grad, low, high = _one_token(cispo_loss, math.log(0.6), math.log(0.5), 2.0, clip_low=1.0, clip_high=4.0)
    assert grad == pytest.approx(-2.4) and not (low or high)


def test_cispo_refuses_sequence_level_and_dual_clip():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="per-token IS weight"):
        cispo_loss(x, x, torch.ones(1), level="sequence", mask=torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="per-token IS weight"):
        cispo_loss(x, x, torch.ones(1), dual_clip=3.0)
    assert {"clip", "cispo"} <= set(POLICY_LOSSES)
