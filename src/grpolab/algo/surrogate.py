"""What every per-token policy loss shares: the importance ratio (per token, or GSPO's sequence form) and the
record it returns (the loss and where a clip acted).

The log-ratio ``logprobs - old_logprobs`` is clamped to [-20, 20] before the exp (verl does the same), so
a single badly-off token cannot overflow the ratio to inf. GSPO's sequence log-ratio is clamped the same
way (verl clamps it at 10 from above only).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from grpolab.algo.masked import masked_mean

__all__ = ["LOG_RATIO_CLAMP", "SurrogateLoss"]

LOG_RATIO_CLAMP = 20.0


class SurrogateLoss(NamedTuple):
    """Per-token clipped surrogate loss and where each clip bound is active (all ``[N, T]``)."""

    loss: Tensor
    """``[N, T]`` float, the loss to minimise, 0 outside the mask."""
    clipped_low: Tensor
    """``[N, T]`` bool: A < 0 and ratio < 1 - clip_low (gradient zeroed by the clip)."""
    clipped_high: Tensor
    """``[N, T]`` bool: A > 0 and ratio > 1 + clip_high (gradient zeroed by the clip)."""


def _check_surrogate_inputs(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor | None
) -> Tensor:
    """Validate shapes and return the advantages as ``[N, T]``."""
    if logprobs.dim() != 2 or old_logprobs.shape != logprobs.shape:
        raise ValueError(
            f"logprobs and old_logprobs must both be [N, T], got {tuple(logprobs.shape)} "
            f"and {tuple(old_logprobs.shape)}"
        )
    if mask is not None and (mask.dtype != torch.bool or mask.shape != logprobs.shape):
        raise ValueError(
            f"mask must be bool [N, T] = {tuple(logprobs.shape)}, got {mask.dtype} {tuple(mask.shape)}"
        )
    if advantages.shape == logprobs.shape[:1]:
        return advantages.unsqueeze(-1).expand_as(logprobs)
    if advantages.shape != logprobs.shape:
        raise ValueError(
            f"advantages must be [N] or [N, T] with N, T = {tuple(logprobs.shape)}, got {tuple(advantages.shape)}"
        )
    return advantages


def _within_mask(loss: Tensor, clipped_low: Tensor, clipped_high: Tensor, mask: Tensor | None) -> SurrogateLoss:
    """The record with loss 0 and no clip outside ``mask`` (None: every token counts)."""
    if mask is not None:
        loss = torch.where(mask, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))
        clipped_low, clipped_high = clipped_low & mask, clipped_high & mask
    return SurrogateLoss(loss, clipped_low, clipped_high)


def _ratio(logprobs: Tensor, old_logprobs: Tensor, level: str, mask: Tensor | None) -> Tensor:
    """``[N, T]`` importance ratio with its gradient: per token, or GSPO's ``sg[s_i] * pi / sg[pi]``."""
    log_ratio = logprobs - old_logprobs.detach()
    if level == "sequence":
        if mask is None:
            raise ValueError('level="sequence" (GSPO) needs mask to average the log-ratio over each sequence')
        seq_log_ratio = masked_mean(log_ratio, mask, dim=-1).detach().unsqueeze(-1)  # [N, 1]
        log_ratio = seq_log_ratio + logprobs - logprobs.detach()
    elif level != "token":
        raise ValueError(f'level must be "token" or "sequence", got {level!r}')
    return torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
