"""Rollout correction: the sampler's log-probs against the trainer's, and the weights that correct for
the difference.

The sampler (a bf16 weight copy here, a separate inference engine later) and the trainer give the same
tokens slightly different probabilities, so "on-policy" training is quietly off-policy (Yao et al., "Your
Efficient RL Framework Secretly Brings You Off-Policy RL Training", 2025; docs/algorithms.md 4.8). With
``w = pi_train(a; theta_old) / pi_sampler(a; theta_old)`` the policy loss of every token is multiplied by
``sg(f(w))``:

* truncated importance sampling (TIS): ``f(w) = min(w, cap)``;
* masking (MIS, IcePop-style): ``f(w) = w`` where ``w <= cap``, else 0 (the token, or the whole
  sequence, leaves the loss);

per token, or per sequence with ``w_i = exp(sum_t log w_{i,t})`` (TRL's sequence form) given to every
token of row i.

Departures, and why: the sequence log-ratio is clamped to [-20, 20] before the exp, so a long sequence
cannot overflow the weight to inf (its weight is then the cap or masked anyway). The mismatch KL is the
k3 estimate of KL(pi_sampler || pi_train) on the sampled tokens (non-negative, low variance); the
tokens were drawn from the sampler, which is what makes it an estimate of that direction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from grpolab.algo.kl import kl_k3
from grpolab.algo.masked import masked_sum

__all__ = ["ROLLOUT_CORRECTIONS", "mismatch_sums", "rollout_correction_weights"]

LOG_RATIO_CLAMP = 20.0
Level = Literal["token", "sequence"]


def _log_weights(old_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, level: Level) -> Tensor:
    if old_logprobs.shape != sampler_logprobs.shape or mask.shape != old_logprobs.shape or mask.dtype != torch.bool:
        raise ValueError(
            f"old_logprobs, sampler_logprobs and mask (bool) must all be [N, T], got {tuple(old_logprobs.shape)}, "
            f"{tuple(sampler_logprobs.shape)} and {mask.dtype} {tuple(mask.shape)}"
        )
    log_w = torch.where(mask, old_logprobs.detach() - sampler_logprobs, torch.zeros_like(old_logprobs))
    if level == "sequence":
        log_w = log_w.sum(-1, keepdim=True).expand_as(log_w)
    elif level != "token":
        raise ValueError(f'level must be "token" or "sequence", got {level!r}')
    return log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _truncate(log_w: Tensor, cap: float) -> Tensor:
    return log_w.exp().clamp(max=cap)


def _mask(log_w: Tensor, cap: float) -> Tensor:
    w = log_w.exp()
    return torch.where(w <= cap, w, torch.zeros_like(w))


ROLLOUT_CORRECTIONS: dict[str, Callable[[Tensor, float], Tensor]] = {"tis": _truncate, "mis": _mask}
"""``log w [N, T] , cap -> weights [N, T]``: "tis" truncates at the cap, "mis" zeroes weights above it."""


def rollout_correction_weights(
    old_logprobs: Tensor,
    sampler_logprobs: Tensor,
    mask: Tensor,
    *,
    mode: Literal["tis", "mis"],
    level: Level = "token",
    cap: float = 2.0,
) -> Tensor:
    """Per-token correction weights ``sg(f(pi_train / pi_sampler))`` (TIS / MIS; docs/algorithms.md 4.8).

    Args:
        old_logprobs: ``[N, T]`` the trainer's log-probs of the sampled tokens at the sampling weights.
        sampler_logprobs: ``[N, T]`` the sampler's log-probs of the same tokens.
        mask: ``[N, T]`` bool, True = token counts.
        mode: "tis" (truncate at ``cap``) or "mis" (zero above ``cap``).
        level: "token" (one weight per token) or "sequence" (the product over the row, on every token).
        cap: the truncation / masking threshold, > 0 (TIS: 2; verl suggests 1.5-5 per token, 2-10 per sequence).

    Returns:
        ``[N, T]`` weights without gradient, 0 outside the mask; exactly 1 where the two log-probs agree
        (and ``cap >= 1``).
    """
    if mode not in ROLLOUT_CORRECTIONS:
        raise ValueError(f"mode must be one of {tuple(ROLLOUT_CORRECTIONS)}, got {mode!r}")
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    weights = ROLLOUT_CORRECTIONS[mode](_log_weights(old_logprobs, sampler_logprobs, mask, level), cap)
    return torch.where(mask, weights, torch.zeros_like(weights)).detach()


def mismatch_sums(old_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> dict[str, float]:
    """Sums over counted tokens of ``|log pi_train - log pi_sampler|`` and of the k3 estimate of
    KL(pi_sampler || pi_train); divide by the token count for the means.

    Args:
        old_logprobs: ``[N, T]`` the trainer's log-probs at the sampling weights.
        sampler_logprobs: ``[N, T]`` the sampler's.
        mask: ``[N, T]`` bool.
    """
    old = old_logprobs.detach()
    return {
        "sampler_abs_diff": float(masked_sum((old - sampler_logprobs).abs(), mask)),
        "sampler_kl": float(masked_sum(kl_k3(sampler_logprobs, old), mask)),
    }
