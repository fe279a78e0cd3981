"""Policy, value and preference losses, and how per-token losses are reduced to a scalar.

Every loss here is the quantity to MINIMISE (``L = -J``). Per-token losses are ``[N, T]``; ``aggregate``
turns them into a scalar with one of the named normalisations.

Where the code departs from the papers, and why:
* The log-ratio ``logprobs - old_logprobs`` is clamped to [-20, 20] before the exp (verl does the
  same), so a single badly-off token cannot overflow the ratio to inf. GSPO's sequence log-ratio is
  clamped the same way (verl clamps it at 10 from above only).
* Dual clip (verl; Ye et al., arXiv 1912.09729) is offered for ``A < 0``: the loss is capped at
  ``-c * A``, which bounds how hard a very large ratio on a negative-advantage token can push.
* GSPO (arXiv 2507.18071) is computed in its token form, ``s_{i,t} = sg[s_i] * pi/sg[pi]``, which has
  the value of ``s_i`` and the gradient of the paper's sequence-level objective once the per-token
  losses are averaged with ``"seq-mean-token-mean"``, and which also accepts per-token advantages.
* ``aggregate`` takes optional ``total_seqs`` / ``total_tokens``: the normalisers of the whole
  (gradient-accumulated) batch. With them, the micro-batch losses sum exactly to the full-batch loss,
  whereas averaging per-micro-batch means (a common bug) re-weights tokens by micro-batch composition.
* CISPO (MiniMax-M1, arXiv 2506.13585) reuses ``SurrogateLoss``: its ``clipped_low`` / ``clipped_high``
  say where the IS weight was truncated, whatever the advantage's sign (no gradient is dropped there).
* In ``"seq-mean-token-mean"`` a row with no counted token contributes 0 but still counts in ``N``
  (TRL ``loss_type="grpo"``), so filtering a sequence's tokens does not change the other rows' weight.
* ``"batch-token-mean"`` (TRL ``loss_type="bnpo"``) takes a per-row normaliser ``row_norm``: the tokens of the
  row's normalising batch times the number of batches (``batch_row_norms``), so that, like the totals above,
  it does not depend on how the rows are split into micro-batches for memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from grpolab.algo.masked import masked_mean, masked_sum
from grpolab.algo.soft import sapo_loss, vespo_loss
from grpolab.algo.surrogate import (
    LOG_RATIO_CLAMP,
    SurrogateLoss,
    _check_surrogate_inputs,
    _ratio,
    _within_mask,
)

__all__ = [
    "AGGREGATIONS",
    "Aggregation",
    "AggregationMode",
    "POLICY_LOSSES",
    "SurrogateLoss",
    "aggregate",
    "batch_row_norms",
    "cispo_loss",
    "clipped_surrogate_loss",
    "dpo_loss",
    "value_loss",
]

AggregationMode = Literal[
    "seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm", "seq-mean-token-sum", "batch-token-mean"
]


def clipped_surrogate_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    level: Literal["token", "sequence"] = "token",
    mask: Tensor | None = None,
) -> SurrogateLoss:
    """PPO/GRPO clipped surrogate per token (PPO, arXiv 1707.06347; DeepSeekMath Eq. 3, arXiv 2402.03300).

    ``loss = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)``. ``clip_high > clip_low`` is
    DAPO's Clip-Higher (arXiv 2503.14476). With ``dual_clip=c`` (c > 1, verl), tokens with ``A < 0`` have
    their loss capped at ``-c * A``. ``level="sequence"`` is GSPO (arXiv 2507.18071): the ratio of every
    token of row i is ``s_i = exp(masked mean_t (logprobs - old_logprobs))``, with the gradient of
    ``sg[s_i] * exp(logprobs - sg[logprobs])``; it needs ``mask``.

    Args:
        logprobs: ``[N, T]`` under the current policy (with grad).
        old_logprobs: ``[N, T]`` under the sampling policy (no grad).
        advantages: ``[N]`` (one per sequence) or ``[N, T]``.
        clip_low, clip_high: the clip range is ``[1 - clip_low, 1 + clip_high]``.
        dual_clip: the cap ``c`` for ``A < 0``, or None.
        level: ``"token"`` (PPO/GRPO) or ``"sequence"`` (GSPO).
        mask: ``[N, T]`` bool, True = token counts; outputs are 0/False outside it.

    Returns:
        ``SurrogateLoss(loss [N, T], clipped_low [N, T], clipped_high [N, T])``.
    """
    adv = _check_surrogate_inputs(logprobs, old_logprobs, advantages, mask).detach()
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low} and {clip_high}")
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"dual_clip must be > 1 (verl uses 3.0), got {dual_clip}")
    ratio = _ratio(logprobs, old_logprobs, level, mask)
    loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip_low, 1 + clip_high))
    if dual_clip is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * dual_clip), loss)
    clipped_low = (adv < 0) & (ratio < 1 - clip_low)
    clipped_high = (adv > 0) & (ratio > 1 + clip_high)
    return _within_mask(loss, clipped_low, clipped_high, mask)


def cispo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    *,
    clip_low: float = 1.0,
    clip_high: float = 4.0,
    dual_clip: float | None = None,
    level: Literal["token", "sequence"] = "token",
    mask: Tensor | None = None,
) -> SurrogateLoss:
    """CISPO per token (MiniMax-M1, arXiv 2506.13585, Eqs. 4-5): a REINFORCE term weighted by a clipped,
    stop-gradient importance-sampling weight.

    ``loss = -sg(clip(ratio, 1 - clip_low, 1 + clip_high)) * A * logprobs``: the IS weight is clipped,
    not the update, so every token keeps its gradient ``-w * A * grad log pi``. The paper sets no lower
    bound (``clip_low = 1`` gives a floor of 0) and tunes only ``clip_high``. The value is not the
    PPO surrogate's (it carries ``log pi``); its gradient is. ``level="sequence"`` is what TRL 1.16 runs for
    ``loss_type="cispo"`` with ``importance_sampling_level="sequence"`` (it warns, and runs it): every token of
    row i takes the one weight ``clip(exp(masked mean_t (logprobs - old_logprobs)))``, GSPO's ratio, still
    multiplying each token's own ``log pi``; it needs ``mask``.

    Args:
        logprobs: ``[N, T]`` under the current policy (with grad).
        old_logprobs: ``[N, T]`` under the sampling policy (no grad).
        advantages: ``[N]`` or ``[N, T]``.
        clip_low, clip_high: the IS weight is clipped to ``[1 - clip_low, 1 + clip_high]``.
        dual_clip: must be None (CISPO has no PPO min to cap).
        level: ``"token"`` (the paper's weight per token) or ``"sequence"`` (one weight per row, as TRL's).
        mask: ``[N, T]`` bool, True = token counts.

    Returns:
        ``SurrogateLoss(loss, truncated below, truncated above)``, all ``[N, T]``.
    """
    adv = _check_surrogate_inputs(logprobs, old_logprobs, advantages, mask).detach()
    if clip_low < 0 or clip_high <= -1 or clip_low < -clip_high:  # a cap under 1 (TRL's epsilon_high <= 1) is a range
        raise ValueError(
            f"clip_low must be >= 0 and clip_high > -1 with 1 - clip_low <= 1 + clip_high, got {clip_low} and {clip_high}"
        )
    if dual_clip is not None:
        raise ValueError("CISPO clips an IS weight, with no PPO min for a dual clip to cap: use no dual_clip")
    log_ratio = (logprobs - old_logprobs).detach()
    if level == "sequence":
        if mask is None:
            raise ValueError('level="sequence" needs mask to average the log-ratio over each sequence')
        log_ratio = masked_mean(log_ratio, mask, dim=-1).unsqueeze(-1).expand_as(logprobs)  # TRL's (B, 1) weight
    elif level != "token":
        raise ValueError(f'level must be "token" or "sequence", got {level!r}')
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(max(1 - clip_low, 0.0), 1 + clip_high)
    loss = -weight * adv * logprobs
    clipped_low, clipped_high = ratio < 1 - clip_low, ratio > 1 + clip_high
    return _within_mask(loss, clipped_low, clipped_high, mask)


POLICY_LOSSES: dict[str, Callable[..., SurrogateLoss]] = {
    "clip": clipped_surrogate_loss,
    "cispo": cispo_loss,
    "sapo": sapo_loss,
    "vespo": vespo_loss,
}
"""Per-token policy losses by name, all ``(logprobs, old_logprobs, advantages, *, clip_low, clip_high,
dual_clip, level, mask) -> SurrogateLoss``: "clip" is PPO/GRPO's clipped surrogate (GSPO with
``level="sequence"``), "cispo" MiniMax-M1's clipped IS-weight REINFORCE, "sapo" and "vespo" the losses
without a hard clip of grpolab.algo.soft (their own coefficients bound by the trainer with functools.partial)."""


def _rows(mask: Tensor, total_seqs: float | None) -> float | Tensor:
    return mask.shape[0] if total_seqs is None else total_seqs


def _seq_mean_token_mean(
    loss: Tensor, mask: Tensor, *, norm_len: int | None, total_seqs: float | None, total_tokens: float | None,
    row_norm: Tensor | None = None,
) -> Tensor:
    per_seq = masked_mean(loss, mask, dim=-1)  # [N]
    return per_seq.sum() / _rows(mask, total_seqs)


def _token_mean(
    loss: Tensor, mask: Tensor, *, norm_len: int | None, total_seqs: float | None, total_tokens: float | None,
    row_norm: Tensor | None = None,
) -> Tensor:
    tokens = mask.sum().clamp(min=1) if total_tokens is None else total_tokens
    return masked_sum(loss, mask) / tokens


def _seq_mean_token_sum_norm(
    loss: Tensor, mask: Tensor, *, norm_len: int | None, total_seqs: float | None, total_tokens: float | None,
    row_norm: Tensor | None = None,
) -> Tensor:
    if norm_len is None or norm_len < 1:
        raise ValueError(
            'mode "seq-mean-token-sum-norm" (Dr. GRPO) needs norm_len >= 1: pass the max completion length'
        )
    longest = int(mask.sum(-1).max()) if mask.numel() else 0
    if longest > norm_len:
        raise ValueError(
            f"norm_len={norm_len} is shorter than a completion ({longest} tokens); use the max length"
        )
    return masked_sum(loss, mask) / (_rows(mask, total_seqs) * norm_len)


def _seq_mean_token_sum(
    loss: Tensor, mask: Tensor, *, norm_len: int | None, total_seqs: float | None, total_tokens: float | None,
    row_norm: Tensor | None = None,
) -> Tensor:
    return masked_sum(loss, mask) / _rows(mask, total_seqs)


def _batch_token_mean(
    loss: Tensor, mask: Tensor, *, norm_len: int | None, total_seqs: float | None, total_tokens: float | None,
    row_norm: Tensor | None = None,
) -> Tensor:
    if row_norm is None:  # the rows given are one normalising batch
        row_norm = mask.sum().clamp(min=1).to(loss.dtype).expand(mask.shape[0])
    if row_norm.shape != mask.shape[:1]:
        raise ValueError(f"row_norm must be [N] = [{mask.shape[0]}], got {tuple(row_norm.shape)}")
    per_row = torch.where(mask, loss, torch.zeros((), dtype=loss.dtype, device=loss.device)).sum(-1)
    return (per_row / row_norm.to(per_row.dtype)).sum()


def batch_row_norms(mask: Tensor, batch_rows: int, *, num_batches: float | None = None) -> Tensor:
    """``[N]``: each row's normaliser in "batch-token-mean", the rows taken in their order in batches of
    ``batch_rows`` (the last may be shorter): the counted tokens of its batch (at least 1) times
    ``num_batches`` (default: this call's batches; pass every rank's count), as TRL's bnpo divides each
    micro-batch by its own tokens and averages the micro-batches' losses over gradient accumulation and ranks."""
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    tokens = mask.sum(-1).to(torch.float64)
    parts = tokens.split(batch_rows)
    if not parts:
        return tokens
    count = float(len(parts)) if num_batches is None else num_batches
    return torch.cat([part.sum().clamp(min=1).expand(len(part)) for part in parts]) * count


AGGREGATIONS: dict[str, Callable[..., Tensor]] = {
    "seq-mean-token-mean": _seq_mean_token_mean,
    "token-mean": _token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "batch-token-mean": _batch_token_mean,
}
"""Aggregations by name, all ``(loss [N, T], mask [N, T], *, norm_len, total_seqs, total_tokens) -> []``.

* "seq-mean-token-mean": ``(1/N) sum_i (1/|o_i|) sum_t l`` (GRPO, DeepSeekMath Eq. 3; TRL "grpo").
* "token-mean": ``sum_i sum_t l / sum_i |o_i|`` (DAPO Eq. 12, arXiv 2503.14476; TRL "dapo"/"bnpo").
* "seq-mean-token-sum-norm": ``sum_i sum_t l / (N * norm_len)`` (Dr. GRPO, arXiv 2503.20783).
* "seq-mean-token-sum": ``sum_i sum_t l / N`` (verl).
* "batch-token-mean": ``(1/B) sum_b sum_{i in b} sum_t l / sum_{i in b} |o_i|``, over B batches of rows (TRL "bnpo",
  a batch being one micro-batch of ``per_device_train_batch_size`` rows): ``row_norm`` carries each row's divisor.
"""


@dataclass(frozen=True)
class Aggregation:
    """One of ``AGGREGATIONS``, chosen once (``Aggregation.named``) and called per micro-batch as
    ``aggregate`` would be, without the name."""

    reduce: Callable[..., Tensor]
    """An ``AGGREGATIONS`` value: ``(loss, mask, *, norm_len, total_seqs, total_tokens) -> []``."""
    norm_len: int | None = None
    """The constant length of "seq-mean-token-sum-norm" (Dr. GRPO: the max completion length); ignored by the others."""
    batch_rows: int | None = None
    """Rows per normalising batch of "batch-token-mean" (TRL bnpo: per_device_train_batch_size); None for the others."""

    @classmethod
    def named(cls, mode: AggregationMode, *, norm_len: int | None = None, batch_rows: int | None = None) -> Aggregation:
        """The aggregation called ``mode`` (a key of ``AGGREGATIONS``)."""
        if mode not in AGGREGATIONS:
            raise ValueError(f"mode must be one of {tuple(AGGREGATIONS)}, got {mode!r}")
        if batch_rows is not None and (mode != "batch-token-mean" or batch_rows < 1):
            raise ValueError(f'batch_rows >= 1 goes with mode "batch-token-mean" only, got {mode!r} and {batch_rows}')
        return cls(AGGREGATIONS[mode], norm_len, batch_rows)

    def __call__(
        self, loss: Tensor, mask: Tensor, *, total_seqs: float | None = None, total_tokens: float | None = None,
        row_norm: Tensor | None = None,
    ) -> Tensor:
        """The scalar of ``loss`` over ``mask`` (see ``aggregate`` for the arguments)."""
        if mask.dtype != torch.bool or mask.dim() != 2 or loss.shape != mask.shape:
            raise ValueError(
                f"loss and mask must be [N, T] (mask bool), got {tuple(loss.shape)} and {mask.dtype} {tuple(mask.shape)}"
            )
        for name, total in (("total_seqs", total_seqs), ("total_tokens", total_tokens)):
            if total is not None and total <= 0:
                raise ValueError(f"{name} must be > 0 when given, got {total}")
        return self.reduce(
            loss, mask, norm_len=self.norm_len, total_seqs=total_seqs, total_tokens=total_tokens, row_norm=row_norm
        )


def aggregate(
    loss: Tensor,
    mask: Tensor,
    mode: AggregationMode,
    *,
    norm_len: int | None = None,
    total_seqs: float | None = None,
    total_tokens: float | None = None,
    row_norm: Tensor | None = None,
) -> Tensor:
    """Reduce a per-token loss to a scalar with a named normalisation (see ``AGGREGATIONS``); a step that
    aggregates every micro-batch chooses once with ``Aggregation.named``.

    Args:
        loss: ``[N, T]`` per-token loss.
        mask: ``[N, T]`` bool, True = token counts.
        mode: a key of ``AGGREGATIONS``.
        norm_len: the constant length of "seq-mean-token-sum-norm" (the max completion length); required
            there, ignored elsewhere.
        total_seqs: the number of sequences N of the whole gradient-accumulated batch (default: this
            micro-batch's rows). Used by the "seq-mean-*" modes.
        total_tokens: the number of counted tokens of the whole batch (default: this micro-batch's).
            Used by "token-mean". With both totals passed, the micro-batch values sum to the full-batch
            value exactly.
        row_norm: ``[N]``, "batch-token-mean"'s divisor of each row (``batch_row_norms``; default: the rows
            are one batch). Ignored by the other modes.

    Returns:
        A scalar tensor.
    """
    return Aggregation.named(mode, norm_len=norm_len)(
        loss, mask, total_seqs=total_seqs, total_tokens=total_tokens, row_norm=row_norm
    )


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *, clip: float | None = 0.2
) -> tuple[Tensor, Tensor]:
    """Clipped value loss (PPO as in verl/TRL; docs/algorithms.md 2).

    ``0.5 * masked_mean(max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2))``.

    Args:
        values: ``[N, T]`` current value predictions (with grad).
        old_values: ``[N, T]`` predictions at rollout time.
        returns: ``[N, T]`` value targets (e.g. from ``gae_advantages``).
        mask: ``[N, T]`` bool, True = token counts.
        clip: ``c``; None disables clipping.

    Returns:
        ``(loss, clip_frac)``: scalars; ``clip_frac`` is the share of counted tokens where the clipped term
        is the larger one (the clip is active).
    """
    if mask.dtype != torch.bool or mask.dim() != 2:
        raise ValueError(f"mask must be a bool [N, T] tensor, got {mask.dtype} {tuple(mask.shape)}")
    for name, x in (("values", values), ("old_values", old_values), ("returns", returns)):
        if x.shape != mask.shape:
            raise ValueError(f"{name} must be [N, T] = {tuple(mask.shape)}, got {tuple(x.shape)}")
    returns, old_values = returns.detach(), old_values.detach()
    unclipped = (values - returns) ** 2
    if clip is None:
        return 0.5 * masked_mean(unclipped, mask), torch.zeros((), dtype=values.dtype, device=values.device)
    clipped_values = old_values + (values - old_values).clamp(-clip, clip)
    clipped = (clipped_values - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(unclipped, clipped), mask)
    clip_frac = masked_mean((clipped > unclipped).to(values.dtype), mask)
    return loss, clip_frac.detach()


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    *,
    beta: float,
) -> Tensor:
    """DPO loss per pair (Rafailov et al., arXiv 2305.18290; DeepSeekMath Eq. 12).

    ``-log sigmoid(beta * ((pc - rc) - (pr - rr)))``, with sequence log-probs (summed, or length-averaged
    as DeepSeekMath Eq. 12 writes it; the caller chooses).

    Args:
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps: ``[P]``.
        beta: inverse temperature of the implicit reward.

    Returns:
        ``[P]`` losses.
    """
    shapes = {
        tuple(x.shape)
        for x in (policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps)
    }
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        raise ValueError(
            f"all four log-prob tensors must be [P] with the same P, got shapes {sorted(shapes)}"
        )
    margin = (policy_chosen_logps - ref_chosen_logps.detach()) - (
        policy_rejected_logps - ref_rejected_logps.detach()
    )
    return -F.logsigmoid(beta * margin)
