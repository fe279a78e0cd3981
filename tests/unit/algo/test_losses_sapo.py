"""SAPO (algo/losses.py ``sapo_loss``): the soft gate pinned to hand-computed numbers, and TRL 1.16's
``loss_type="sapo"`` (trl/trainer/grpo_trainer.py ``_compute_loss``, written out below) on random tensors."""

import math

import pytest
import torch

from grpolab.algo.losses import aggregate, clipped_surrogate_loss, sapo_loss


def _one_token(logp: float, old_logp: float, adv: float, **kw):
    lp = torch.tensor([[logp]], requires_grad=True)
    out = sapo_loss(lp, torch.tensor([[old_logp]]), torch.tensor([adv]), **kw)
    out.loss.sum().backward()
    return float(out.loss.detach()), float(lp.grad), bool(out.clipped_low | out.clipped_high)


def test_the_gate_at_ratio_one_is_the_policy_gradient():
    # sigmoid(0) * 4 / tau = 2 / tau; gradient 4 * 0.25 * ratio * A = A, whatever tau
    loss, grad, clipped = _one_token(math.log(0.5), math.log(0.5), -1.0, temperature_neg=1.05)
    assert loss == pytest.approx(2 / 1.05) and grad == pytest.approx(1.0) and not clipped
    loss, grad, _ = _one_token(math.log(0.5), math.log(0.5), 2.0, temperature_pos=3.0)
    assert loss == pytest.approx(-2 * 2 / 3) and grad == pytest.approx(-2.0)


def test_the_gate_fades_the_gradient_where_the_clip_cuts_it():
    # ratio 2, A = +1, tau 1: loss -4 sigmoid(1) = -2.9242; gradient -4 s (1 - s) * 2 = -1.5729
    s = 1 / (1 + math.exp(-1))
    loss, grad, clipped = _one_token(math.log(0.5), math.log(0.25), 1.0)
    assert loss == pytest.approx(-4 * s) and grad == pytest.approx(-8 * s * (1 - s)) and not clipped
    lp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    clipped_surrogate_loss(lp, torch.tensor([[math.log(0.25)]]), torch.tensor([1.0])).loss.sum().backward()
    assert float(lp.grad) == 0.0  # the hard clip drops it
    # the negative temperature is chosen for A <= 0: ratio 0.5, A = -1, tau 2: loss 2 sigmoid(-1)
    loss, grad, _ = _one_token(math.log(0.25), math.log(0.5), -1.0, temperature_pos=1.0, temperature_neg=2.0)
    s_neg = 1 / (1 + math.exp(1))
    assert loss == pytest.approx(2 * s_neg) and grad == pytest.approx(4 * s_neg * (1 - s_neg) * 0.5)


def test_sapo_refuses_dual_clip_and_bad_temperatures():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="no hard clip"):
        sapo_loss(x, x, torch.ones(1), dual_clip=3.0)
    with pytest.raises(ValueError, match="temperatures must be > 0"):
        sapo_loss(x, x, torch.ones(1), temperature_neg=0.0)


def _trl_sapo(per_token_logps, old_per_token_logps, advantages, mask, level, tau_pos, tau_neg):
    """_compute_loss with loss_type="sapo" (one micro-batch, no accumulation)."""
    advantages = advantages.unsqueeze(1)
    log_ratio = per_token_logps - old_per_token_logps
    if level == "token":
        log_importance_weights = log_ratio
    else:
        log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        log_importance_weights = log_importance_weights.unsqueeze(-1)
    coef_1 = torch.exp(log_importance_weights)
    temperatures = torch.where(advantages > 0, tau_pos, tau_neg)
    soft_coef_1 = torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures
    per_token_loss = -soft_coef_1 * advantages
    return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_sapo_with_grpos_normaliser_is_trls_value_and_gradient(level):
    gen = torch.Generator().manual_seed(0)
    n, t = 16, 7
    mask = torch.arange(t) < torch.randint(1, t + 1, (n, 1), generator=gen)
    old = -torch.rand(n, t, generator=gen) * 2
    new = (old + torch.randn(n, t, generator=gen) * 0.5).requires_grad_(True)
    adv = torch.randn(n, generator=gen)
    ours = aggregate(
        sapo_loss(new, old, adv, temperature_pos=1.0, temperature_neg=1.05, level=level, mask=mask).loss,
        mask, "seq-mean-token-mean",
    )  # fmt: skip
    (grad_ours,) = torch.autograd.grad(ours, new)
    trl = _trl_sapo(new, old, adv, mask.float(), level, 1.0, 1.05)
    (grad_trl,) = torch.autograd.grad(trl, new)
    torch.testing.assert_close(ours, trl)
    torch.testing.assert_close(grad_ours, grad_trl)
