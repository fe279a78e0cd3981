"""Policy losses without a hard clip: SAPO's soft gate and VESPO's gamma weight on the sequence ratio.

Both take the signature of ``grpolab.algo.losses.POLICY_LOSSES`` (their own coefficients bound by the
trainer with functools.partial); neither clips, so their ``SurrogateLoss`` reports no clipped token.

Departures from TRL 1.16 (``loss_type="sapo"`` / ``"vespo"`` in grpo_trainer.py), and why: SAPO's ratio is
clamped like every other ratio here (grpolab.algo.surrogate; TRL does not clamp it, and the gate has
saturated long before e^20).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from grpolab.algo.surrogate import (
    LOG_RATIO_CLAMP,
    SurrogateLoss,
    _check_surrogate_inputs,
    _ratio,
    _within_mask,
)

__all__ = ["sapo_loss", "vespo_loss"]


def sapo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    *,
    temperature_pos: float = 1.0,
    temperature_neg: float = 1.05,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    level: Literal["token", "sequence"] = "token",
    mask: Tensor | None = None,
) -> SurrogateLoss:
    """SAPO per token (Soft Adaptive Policy Optimization, arXiv 2511.20347; TRL ``loss_type="sapo"``): a
    smooth gate in place of the hard clip.

    ``loss = -sigmoid(tau * (ratio - 1)) * 4 / tau * A`` with ``tau = temperature_pos`` where ``A > 0``, else
    ``temperature_neg``. Its gradient is ``-4 p (1 - p) * ratio * A * grad log pi`` (``p`` the sigmoid): the
    plain policy gradient at ratio 1, fading smoothly (never cut) as the ratio moves away; a larger ``tau``
    fades faster (the paper: tau_neg > tau_pos, since negative updates destabilise more). ``level="sequence"``
    gates GSPO's sequence ratio (as TRL); the gradient equals TRL's ``(B, 1)`` form under
    ``"seq-mean-token-mean"``.

    Args:
        logprobs: ``[N, T]`` under the current policy (with grad).
        old_logprobs: ``[N, T]`` under the sampling policy (no grad).
        advantages: ``[N]`` or ``[N, T]``.
        temperature_pos, temperature_neg: tau for positive / non-positive advantages (TRL: 1.0 and 1.05), > 0.
        clip_low, clip_high: accepted for the common signature of ``POLICY_LOSSES`` and unused (no hard clip).
        dual_clip: must be None.
        level: ``"token"`` or ``"sequence"`` (GSPO's ratio, which needs ``mask``).
        mask: ``[N, T]`` bool, True = token counts.

    Returns:
        ``SurrogateLoss(loss, all False, all False)``: nothing is clipped.
    """
    if dual_clip is not None:
        raise ValueError("SAPO has no hard clip to cap: use dual_clip=None")
    if temperature_pos <= 0 or temperature_neg <= 0:
        raise ValueError(f"SAPO's temperatures must be > 0, got {temperature_pos} and {temperature_neg}")
    adv = _check_surrogate_inputs(logprobs, old_logprobs, advantages, mask).detach()
    ratio = _ratio(logprobs, old_logprobs, level, mask)
    tau = torch.where(adv > 0, temperature_pos, temperature_neg).to(ratio.dtype)
    loss = -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * adv
    none = torch.zeros_like(logprobs, dtype=torch.bool)
    return _within_mask(loss, none, none, mask)


@torch.no_grad()
def _gamma_weight(log_w: Tensor, adv: Tensor, *, k_pos: float, lambda_pos: float, k_neg: float, lambda_neg: float) -> Tensor:
    """VESPO's phi(w) = w^k e^{lambda (1 - w)} (phi(1) = 1), in log space, k and lambda by the sign of A."""
    nonneg = adv >= 0
    k = torch.where(nonneg, k_pos, k_neg).to(log_w.dtype)
    lam = torch.where(nonneg, lambda_pos, lambda_neg).to(log_w.dtype).clamp(min=1e-4)
    log_phi = lam + k * log_w - lam * log_w.exp()
    return log_phi.exp().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
    is_weights: Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    level: Literal["token", "sequence"] = "token",
    mask: Tensor | None = None,
) -> SurrogateLoss:
    """VESPO per token (Variational Sequence-Level Soft Policy Optimization, arXiv 2602.10693; TRL
    ``loss_type="vespo"``, ``get_gamma_weights``): a REINFORCE term weighted by a smooth function of the
    SEQUENCE importance weight.

    ``w_i = exp(sum_t log(pi / pi_old))`` (the sum, not GSPO's mean; each token's log-ratio clamped to
    [-20, 20], the sum to [log 1e-8, 20]), times the rollout-correction weights when given;
    ``phi(w) = w^k e^{lambda (1 - w)}`` with ``(k, lambda) = (k_pos, lambda_pos)`` where ``A >= 0`` else
    ``(k_neg, lambda_neg)``; ``loss = -sg(phi(w_i)) * A * log pi``. phi(1) = 1, so at ratio 1 this is the
    policy gradient; ``k`` down-weights sequences whose ratio fell, ``lambda`` those whose ratio grew.

    Args:
        logprobs: ``[N, T]`` under the current policy (with grad).
        old_logprobs: ``[N, T]`` under the sampling policy (no grad).
        advantages: ``[N]`` or ``[N, T]``.
        k_pos, lambda_pos, k_neg, lambda_neg: TRL's defaults 2, 3, 3, 2.
        is_weights: ``[N, T]`` per-token rollout-correction weights (TIS / MIS); TRL folds them into ``w``
            instead of multiplying the loss by them. A weight of 0 (MIS) counts as 1e-8.
        clip_low, clip_high: accepted for the common signature of ``POLICY_LOSSES`` and unused.
        dual_clip: must be None.
        level: must be "token" (VESPO builds its own sequence weight from the token log-ratios).
        mask: ``[N, T]`` bool, True = token counts (the sums run over it).

    Returns:
        ``SurrogateLoss(loss, all False, all False)``.
    """
    adv = _check_surrogate_inputs(logprobs, old_logprobs, advantages, mask).detach()
    if dual_clip is not None or level != "token":
        raise ValueError("VESPO weighs each sequence by its own summed ratio: use level='token' and no dual_clip")
    counted = torch.ones_like(logprobs, dtype=torch.bool) if mask is None else mask
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    log_ratio = (logprobs - old_logprobs).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    seq = torch.where(counted, log_ratio, zero).sum(-1, keepdim=True)
    if is_weights is not None:
        log_is = is_weights.detach().log().clamp(math.log(1e-8), LOG_RATIO_CLAMP)
        seq = seq + torch.where(counted, log_is, zero).sum(-1, keepdim=True)
    log_w = seq.clamp(math.log(1e-8), LOG_RATIO_CLAMP).expand_as(logprobs)
    phi = _gamma_weight(log_w, adv, k_pos=k_pos, lambda_pos=lambda_pos, k_neg=k_neg, lambda_neg=lambda_neg)
    loss = torch.where(counted, -phi * adv * logprobs, zero)
    none = torch.zeros_like(counted)
    return SurrogateLoss(loss, none, none)
