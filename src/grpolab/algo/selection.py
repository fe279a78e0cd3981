"""Which tokens get policy-gradient loss: DeepSeek-V3.2's off-policy sequence mask and the "80/20"
high-entropy token mask. Both return a bool keep-mask; the trainer multiplies the per-token policy loss
by it (the KL term and the normalisers are left alone, as TRL does).

* Off-policy sequence masking (DeepSeek-V3.2, arXiv 2512.02556, Eq. 9; TRL ``off_policy_mask_threshold``):
  a completion with a negative advantage whose mean per-token ``log pi_sampler - log pi_theta`` (a k1
  estimate of KL(pi_sampler || pi_theta) on its own tokens) exceeds ``delta`` leaves the loss. Positive
  advantages are always kept: pushing up a token the policy has drifted away from is not what destabilises.
* High-entropy minority tokens (Wang et al., "Beyond the 80/20 Rule", arXiv 2506.01939; TRL
  ``top_entropy_quantile``): only tokens whose entropy is at or above the ``1 - rho`` quantile of the
  counted tokens' entropies keep their policy-gradient loss (the paper: rho = 0.2).

Departures from TRL, and why: ``linear_quantile`` is torch.quantile's linear interpolation computed with
two ``kthvalue`` calls, because torch.quantile refuses inputs of more than 2**24 entries (a 16k-token
completion x 1,024 rows is 16.8M). A NaN sampler log-prob counts as 0 in the mean, as TRL (a token the
engine could not score is no evidence of drift); the mask is computed without gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpolab.algo.masked import masked_mean

__all__ = ["entropy_threshold", "high_entropy_mask", "linear_quantile", "off_policy_sequence_mask"]


def _check(mask: Tensor, **tensors: Tensor) -> None:
    if mask.dtype != torch.bool or mask.dim() != 2:
        raise ValueError(f"mask must be a bool [N, T] tensor, got {mask.dtype} {tuple(mask.shape)}")
    for name, x in tensors.items():
        if x.shape != mask.shape:
            raise ValueError(f"{name} must be [N, T] = {tuple(mask.shape)}, got {tuple(x.shape)}")


@torch.no_grad()
def off_policy_sequence_mask(
    advantages: Tensor, logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, *, threshold: float
) -> Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (TRL ``GRPOTrainer.get_off_policy_mask``).

    ``keep = (A >= 0) | (mean_t (log pi_sampler - log pi_theta) <= threshold)``, the mean over each row's
    counted tokens (a row with none has mean 0).

    Args:
        advantages: ``[N]`` or ``[N, T]``; compared per entry, so a per-token advantage gives a per-token mask.
        logprobs: ``[N, T]`` under the current policy (detached here).
        sampler_logprobs: ``[N, T]`` under the policy that sampled the tokens (the inference engine's).
        mask: ``[N, T]`` bool, True = token counts.
        threshold: delta, in nats per token (DeepSeek-V3.2 and TRL's docs: a positive value such as 0.5).

    Returns:
        ``[N, T]`` bool, True = the token keeps its policy-gradient loss; False outside ``mask``.
    """
    _check(mask, logprobs=logprobs, sampler_logprobs=sampler_logprobs)
    if advantages.shape == mask.shape[:1]:
        advantages = advantages.unsqueeze(-1)
    elif advantages.shape != mask.shape:
        raise ValueError(f"advantages must be [N] or [N, T] = {tuple(mask.shape)}, got {tuple(advantages.shape)}")
    log_ratio = torch.nan_to_num(sampler_logprobs - logprobs.detach(), nan=0.0)
    seq_kl = masked_mean(log_ratio, mask, dim=-1).unsqueeze(-1)  # [N, 1]
    return ((advantages >= 0) | (seq_kl <= threshold)).expand_as(mask) & mask


def linear_quantile(x: Tensor, q: float) -> Tensor:
    """The ``q`` quantile of the 1-D ``x`` with linear interpolation, as ``torch.quantile(x, q)``, for any size."""
    if x.dim() != 1 or x.numel() == 0:
        raise ValueError(f"x must be a non-empty 1-D tensor, got shape {tuple(x.shape)}")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    rank = torch.tensor(q, dtype=x.dtype) * (x.numel() - 1)  # torch.quantile's rank, in x's dtype
    below = int(rank.floor())
    above = min(below + 1, x.numel() - 1)
    lo = torch.kthvalue(x, below + 1).values
    hi = torch.kthvalue(x, above + 1).values if above != below else lo
    return torch.lerp(lo, hi, (rank - below).to(x.device))


@torch.no_grad()
def high_entropy_mask(entropy: Tensor, mask: Tensor, *, top_quantile: float, threshold: Tensor | None = None) -> Tensor:
    """The 80/20 rule's token mask (TRL ``GRPOTrainer.get_high_entropy_mask``).

    ``keep = entropy >= quantile(entropy of the counted tokens, 1 - top_quantile)``: ``top_quantile=0.2``
    keeps the top 20% (ties at the threshold are kept), ``0`` only the tokens at the maximum, ``1`` all.

    Args:
        entropy: ``[N, T]`` per-token entropy of the current policy's distribution (detached here).
        mask: ``[N, T]`` bool, True = token counts.
        top_quantile: rho in [0, 1].
        threshold: the entropy threshold when the quantile spans more tokens than these (every rank's, a
            whole minibatch's): see ``entropy_threshold``; None = computed from these tokens.

    Returns:
        ``[N, T]`` bool, True = the token keeps its policy-gradient loss; False outside ``mask`` (all False
        when nothing is counted).
    """
    _check(mask, entropy=entropy)
    if threshold is None:
        counted = entropy.detach()[mask].float()
        if counted.numel() == 0:
            return torch.zeros_like(mask)
        threshold = entropy_threshold(counted, top_quantile)
    return (entropy.detach() >= threshold.to(entropy.device, entropy.dtype)) & mask


def entropy_threshold(counted_entropy: Tensor, top_quantile: float) -> Tensor:
    """The entropy at the ``1 - top_quantile`` quantile of ``counted_entropy`` (1-D, the counted tokens)."""
    if not 0.0 <= top_quantile <= 1.0:
        raise ValueError(f"top_quantile must be in [0, 1] (the paper: 0.2), got {top_quantile}")
    return linear_quantile(counted_entropy.float(), 1.0 - top_quantile)
