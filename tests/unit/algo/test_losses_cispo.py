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


def test_cispo_at_sequence_level_weights_every_token_by_its_rows_clipped_mean_ratio():
    # TRL 1.16, loss_type="cispo" with importance_sampling_level="sequence": -sg(clamp(exp(mean_t log r))) * A * log pi.
    # row 0: ratios 0.6/0.3 = 2 and 0.3/0.3 = 1 (the third token is masked out: its ratio 90 must not count);
    #        mean log-ratio log(2)/2, ratio sqrt(2) = 1.414 > cap 1.2, so both tokens weigh 1.2
    # row 1: ratios 0.4/0.5 = 0.8 twice: weight 0.8 (inside [0, 1.2]); A = -2
    logp = torch.log(torch.tensor([[0.6, 0.3, 0.9], [0.4, 0.4, 0.5]])).requires_grad_(True)
    old = torch.log(torch.tensor([[0.3, 0.3, 0.01], [0.5, 0.5, 0.5]]))
    mask = torch.tensor([[True, True, False], [True, True, False]])
    out = cispo_loss(logp, old, torch.tensor([1.0, -2.0]), clip_low=1.0, clip_high=0.2, level="sequence", mask=mask)
    out.loss.sum().backward()
    expected = [[-1.2 * math.log(0.6), -1.2 * math.log(0.3), 0.0], [1.6 * math.log(0.4), 1.6 * math.log(0.4), 0.0]]
    torch.testing.assert_close(out.loss.detach(), torch.tensor(expected))
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.2, -1.2, 0.0], [1.6, 1.6, 0.0]]))
    assert out.clipped_high.tolist() == [[True, True, False], [False, False, False]]
    assert not out.clipped_low.any()
    # per token, row 0's second token (ratio 1) weighs 1: the sequence weight is not the token one
    token = torch.log(torch.tensor([[0.6, 0.3, 0.9], [0.4, 0.4, 0.5]])).requires_grad_(True)
    cispo_loss(token, old, torch.tensor([1.0, -2.0]), clip_low=1.0, clip_high=0.2, mask=mask).loss.sum().backward()
    torch.testing.assert_close(token.grad[0], torch.tensor([-1.2, -1.0, 0.0]))


def test_cispo_refuses_a_dual_clip_and_a_sequence_level_without_mask():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="needs mask"):
        cispo_loss(x, x, torch.ones(1), level="sequence")
    with pytest.raises(ValueError, match="no dual_clip"):
        cispo_loss(x, x, torch.ones(1), dual_clip=3.0)
    assert {"clip", "cispo"} <= set(POLICY_LOSSES)
