"""Masked reductions over token tensors.

Masks are bool, True = the entry counts. Entries where the mask is False never reach a result, even if
they hold NaN or inf (they are replaced with 0 by ``torch.where`` rather than multiplied by 0).

Departures from the usual helpers (verl ``core_algos``/``torch_functional``, TRL), and why:
* An empty selection gives a mean of 0 and a variance of 0 instead of NaN or an error, so a degenerate
  micro-batch (every row filtered out) cannot poison a training step with NaN.
* ``masked_var`` with fewer than 2 counted entries (unbiased) gives 0, for the same reason.
* ``masked_whiten`` returns 0 outside the mask, so padding never carries a value.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["masked_mean", "masked_sum", "masked_var", "masked_whiten"]


def _check(x: Tensor, mask: Tensor) -> None:
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor (True = counts), got dtype {mask.dtype}")
    if x.shape != mask.shape:
        raise ValueError(f"x and mask must have the same shape, got {tuple(x.shape)} and {tuple(mask.shape)}")


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` where ``mask`` is True.

    Args:
        x: any shape, e.g. ``[N, T]``.
        mask: bool, same shape as ``x``.
        dim: the dimension to reduce; ``None`` reduces over all entries (scalar result).
    """
    _check(x, mask)
    kept = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return kept.sum() if dim is None else kept.sum(dim)


def _count(mask: Tensor, dim: int | None, dtype: torch.dtype) -> Tensor:
    return (mask.sum() if dim is None else mask.sum(dim)).to(dtype)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over the entries where ``mask`` is True; 0 where nothing is counted.

    Args:
        x: any shape, e.g. ``[N, T]``.
        mask: bool, same shape as ``x``.
        dim: the dimension to reduce (``dim=-1`` on ``[N, T]`` gives ``[N]``); ``None`` = all entries.
    """
    total = masked_sum(x, mask, dim)
    return total / _count(mask, dim, x.dtype).clamp(min=1)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True, *, dim: int | None = None) -> Tensor:
    """Variance of ``x`` over the entries where ``mask`` is True.

    ``unbiased=True`` divides by ``n - 1`` (Bessel, as ``torch.var``), else by ``n``. With too few counted
    entries (``n < 2`` unbiased, ``n < 1`` population) the variance is 0.

    Args:
        x: any shape, e.g. ``[N, T]``.
        mask: bool, same shape as ``x``.
        unbiased: Bessel correction.
        dim: the dimension to reduce; ``None`` = all entries (scalar result).
    """
    mean = masked_mean(x, mask, dim)
    if dim is not None:
        mean = mean.unsqueeze(dim)
    sq = masked_sum((x - mean) ** 2, mask, dim)
    n = _count(mask, dim, x.dtype)
    denom = n - 1 if unbiased else n
    return torch.where(denom > 0, sq / denom.clamp(min=1), torch.zeros_like(sq))


def masked_whiten(x: Tensor, mask: Tensor, *, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Whiten ``x`` with the mean and unbiased variance of its counted entries (all of them pooled).

    ``(x - mean) / sqrt(var + eps)``; with ``shift_mean=False`` the mean is added back, so only the
    scale changes (as verl/TRL ``masked_whiten``, used on PPO advantages and rewards). Entries outside
    the mask are 0.

    Args:
        x: any shape, e.g. ``[N, T]``.
        mask: bool, same shape as ``x``.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=True)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(mask, out, torch.zeros((), dtype=out.dtype, device=out.device))
