"""SAPO and VESPO (algo/soft.py): the soft gate and the gamma weight pinned to hand-computed numbers, and
TRL 1.16's ``loss_type="sapo"`` / ``"vespo"`` (trl/trainer/grpo_trainer.py ``_compute_loss`` and
``get_gamma_weights``, written out below) on random tensors."""

import math

import pytest
import torch

from grpolab.algo.losses import POLICY_LOSSES, aggregate, clipped_surrogate_loss
from grpolab.algo.soft import sapo_loss, vespo_loss


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


def test_vespo_at_ratio_one_is_the_policy_gradient_and_fades_off_policy():
    lp = torch.log(torch.tensor([[0.5, 0.25]])).requires_grad_(True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    out = vespo_loss(lp, lp.detach(), torch.tensor([2.0]), mask=mask)  # w = 1: phi = 1
    out.loss.sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-2.0, -2.0]]))
    assert not (out.clipped_low | out.clipped_high).any()
    # sequence ratio w = 2 (log-ratios log 2 and 0 summed), A >= 0: phi = 2^2 e^{3 (1 - 2)} = 4 / e^3
    lp = torch.log(torch.tensor([[0.5, 0.25]])).requires_grad_(True)
    old = torch.log(torch.tensor([[0.25, 0.25]]))
    vespo_loss(lp, old, torch.tensor([1.0]), mask=mask).loss.sum().backward()
    torch.testing.assert_close(lp.grad, torch.full((1, 2), -4 / math.e**3))
    # A < 0 takes (k, lambda) = (3, 2): phi(2) = 8 e^{-2}; a rollout weight of 0.5 brings w back to 1: phi = 1
    lp.grad = None
    vespo_loss(lp, old, torch.tensor([-1.0]), mask=mask).loss.sum().backward()
    torch.testing.assert_close(lp.grad, torch.full((1, 2), 8 / math.e**2))
    lp.grad = None
    half = torch.tensor([[0.5, 1.0]])
    vespo_loss(lp, old, torch.tensor([-1.0]), mask=mask, is_weights=half).loss.sum().backward()
    torch.testing.assert_close(lp.grad, torch.ones(1, 2))
    with pytest.raises(ValueError, match="level='token'"):
        vespo_loss(lp, old, torch.ones(1), mask=mask, level="sequence")
    assert set(POLICY_LOSSES) == {"clip", "cispo", "sapo", "vespo"}


def _trl_gamma_weights(advantages, log_ratio_per_token, mask, importance_sampling_ratio, k_pos, lambda_pos, k_neg,
                       lambda_neg):  # fmt: skip
    """GRPOTrainer.get_gamma_weights."""
    lower_clamp = math.log(1e-8)
    log_ratio_clamped = torch.clamp(log_ratio_per_token, -20.0, 20.0)
    seq_log_ratio = torch.sum(log_ratio_clamped * mask, dim=-1, keepdim=True)
    if importance_sampling_ratio is not None:
        log_is_ratio = torch.clamp(torch.log(importance_sampling_ratio), lower_clamp, 20.0)
        seq_log_ratio += torch.sum(log_is_ratio, dim=-1, keepdim=True)
    log_w_seq = torch.clamp(seq_log_ratio, lower_clamp, 20.0)
    w_seq = torch.exp(log_w_seq)
    is_nonneg_adv = advantages >= 0
    k_seq = torch.where(is_nonneg_adv, k_pos, k_neg)
    lambda_seq = torch.where(is_nonneg_adv, lambda_pos, lambda_neg).clamp(min=1e-4)
    log_phi = lambda_seq + k_seq * log_w_seq - lambda_seq * w_seq
    return torch.exp(log_phi).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


@pytest.mark.parametrize("with_is", [False, True])
def test_vespo_with_dapos_normaliser_is_trls_value_and_gradient(with_is):
    gen = torch.Generator().manual_seed(3)
    n, t = 16, 6
    mask = torch.arange(t) < torch.randint(1, t + 1, (n, 1), generator=gen)
    old = -torch.rand(n, t, generator=gen) * 2
    new = (old + torch.randn(n, t, generator=gen) * 0.2).requires_grad_(True)
    adv = torch.randn(n, generator=gen)
    # TRL's token-level IS ratios: 1 on padding (its log-ratio is masked to 0), 0 where token_mask dropped one
    is_ratio = None
    if with_is:
        is_ratio = torch.where(mask, torch.rand(n, t, generator=gen) * 2, torch.ones(n, t))
        is_ratio[0, 0] = 0.0
    kw = {"k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0}
    ours = aggregate(vespo_loss(new, old, adv, mask=mask, is_weights=is_ratio, **kw).loss, mask, "token-mean")
    (grad_ours,) = torch.autograd.grad(ours, new)
    phi = _trl_gamma_weights(adv[:, None], (new - old).detach(), mask.float(), is_ratio, **kw)
    trl = (-phi * adv[:, None] * new * mask).sum() / mask.sum()  # loss_type="vespo": the dapo normaliser
    (grad_trl,) = torch.autograd.grad(trl, new)
    torch.testing.assert_close(ours, trl)
    torch.testing.assert_close(grad_ours, grad_trl)
