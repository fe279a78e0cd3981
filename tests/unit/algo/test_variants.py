"""REINFORCE++ (full and -baseline), CISPO and rollout correction pinned to hand-computed numbers."""

import itertools
import math

import pytest
import torch

from grpolab.algo.advantages import OUTCOME_ESTIMATORS
from grpolab.algo.correction import mismatch_sums, rollout_correction_weights
from grpolab.algo.losses import POLICY_LOSSES, cispo_loss, clipped_surrogate_loss
from grpolab.algo.reinforce import TOKEN_ESTIMATORS, reinforce_pp_advantages, reinforce_pp_baseline_advantages


def close(actual, expected, **kw):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), **kw)


RAGGED = torch.tensor([[True, True, True], [True, True, False]])


def test_reinforce_pp_kl_in_every_token_reward_return_to_go_then_token_whitening():
    # arXiv 2501.03262 Eqs. 8-10, beta = 0.5, gamma = 1.
    # token rewards: row 0 [-0.05, -0.10, -0.15 + 1] ; row 1 [-0.25, 0.05 + 0]
    # returns-to-go: row 0 [0.70, 0.75, 0.85] ; row 1 [-0.20, 0.05]
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.5, -0.1, 0.0]])
    adv = reinforce_pp_advantages(torch.tensor([1.0, 0.0]), RAGGED, token_kl=kl, beta=0.5, gamma=1.0)
    returns = [0.70, 0.75, 0.85, -0.20, 0.05]
    mean = sum(returns) / 5  # 0.43
    std = math.sqrt(sum((x - mean) ** 2 for x in returns) / 4 + 1e-8)  # unbiased, over the 5 tokens
    z = [(x - mean) / std for x in returns]
    close(adv, [z[:3], [z[3], z[4], 0.0]], atol=1e-5, rtol=0)
    # gamma discounts the return (row 1 becomes [-0.25 + 0.5 * 0.05, 0.05], and so on)
    discounted = reinforce_pp_advantages(torch.tensor([1.0, 0.0]), RAGGED, token_kl=kl, beta=0.5, gamma=0.5)
    assert not torch.allclose(adv, discounted)


def test_reinforce_pp_baseline_weights_tokens_and_recentres():
    # rewards [1, 0]: group-centred [0.5, -0.5]; completion 0 has 3 tokens, completion 1 has 1.
    # token values [.5 .5 .5 -.5]: mean .25, unbiased var (3 * .0625 + .5625) / 3 = .25 -> std .5
    mask = torch.tensor([[True, True, True], [True, False, False]])
    adv = reinforce_pp_baseline_advantages(torch.tensor([[1.0, 0.0]]), mask)
    close(adv, [[0.5, 0.5, 0.5], [-1.5, 0.0, 0.0]], atol=1e-6, rtol=0)
    # the per-sequence "group mean, batch std" estimator gives +-0.7071 here: a different estimator
    seq = OUTCOME_ESTIMATORS["batch_std"](torch.tensor([[1.0, 0.0]]), torch.ones(1, 2, dtype=torch.bool), eps=0.0)
    close(seq, [[0.7071, -0.7071]], atol=1e-4, rtol=0)


def test_reinforce_pp_baseline_leaves_invalid_rows_out():
    mask = torch.ones(4, 2, dtype=torch.bool)
    valid = torch.tensor([[True, True, True, False]])
    adv = reinforce_pp_baseline_advantages(torch.tensor([[1.0, 0.0, 0.0, 7.0]]), mask, valid)
    assert torch.equal(adv[3], torch.zeros(2))
    # centred [2/3, -1/3, -1/3] on 2 tokens each: mean 0, unbiased var (2 * (4/9 + 1/9 + 1/9)) / 5 = 4/15
    close(adv[0], [(2 / 3) / math.sqrt(4 / 15)] * 2, atol=1e-5, rtol=0)


def test_token_estimators_differ():
    rewards = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    valid = torch.ones_like(rewards, dtype=torch.bool)
    mask = torch.tensor([[True] * 3, [True, True, False], [True, False, False]] * 2)
    kl = torch.full(mask.shape, 0.1)
    outs = {name: fn(rewards, valid, mask, kl, beta=0.1, gamma=1.0) for name, fn in TOKEN_ESTIMATORS.items()}
    for a, b in itertools.combinations(outs, 2):
        assert not torch.allclose(outs[a], outs[b]), f"{a} behaves like {b}"


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
    assert set(POLICY_LOSSES) == {"clip", "cispo"}


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
