"""Micro-batches bounded by rows and by padded tokens (train.micro_batch_size, train.max_tokens_per_micro_batch).

Activation memory grows with the padded tokens of a forward (rows x (longest prompt + longest
completion)), not with the row count: a fixed row count that fits 100-token completions runs out of
memory at 4,000. With a token budget, rows are sorted by length, longest first, and each micro-batch
takes rows while its padded size stays within the budget (a single row longer than the budget runs
alone). Gradient accumulation stays exact: the loss of each micro-batch is normalised by the totals of
its whole minibatch (grpolab.algo.losses.aggregate), whatever the split.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from grpolab.errors import ConfigError
from grpolab.distributed import dist


def split_rows(
    rows: torch.Tensor,
    completion_lengths: torch.Tensor,
    size: int,
    *,
    max_tokens: int | None = None,
    prompt_lengths: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """``rows`` (indices into the length tensors) in micro-batches of at most ``size`` rows and, with
    ``max_tokens``, at most that many padded tokens; rows of similar length go together."""
    if max_tokens is None:
        order = rows[torch.argsort(completion_lengths[rows], descending=True, stable=True)]
        return _same_count_on_every_rank(list(order.split(size)))
    prompts = prompt_lengths[rows] if prompt_lengths is not None else torch.zeros_like(rows)
    total = prompts + completion_lengths[rows]
    order = torch.argsort(total, descending=True, stable=True)
    out, start, widest_prompt, longest = [], 0, 0, 0
    for i, (p, c) in enumerate(zip(prompts[order].tolist(), completion_lengths[rows][order].tolist(), strict=True)):
        wp, lc = max(widest_prompt, p), max(longest, c)
        if i > start and (i - start >= size or (i - start + 1) * (wp + lc) > max_tokens):
            out.append(rows[order[start:i]])
            start, wp, lc = i, p, c
        widest_prompt, longest = wp, lc
    out.append(rows[order[start:]])
    return _same_count_on_every_rank(out)


def _same_count_on_every_rank(parts: list[torch.Tensor]) -> list[torch.Tensor]:
    """Under torchrun, DDP and FSDP need the same number of forwards and backwards on every rank: split
    the largest micro-batches (each split only shrinks them) until this rank has the most any rank has."""
    n = int(dist.all_reduce_max(float(len(parts))))
    while len(parts) < n:
        i = max(range(len(parts)), key=lambda j: len(parts[j]))
        if len(parts[i]) < 2:
            raise ConfigError(
                f"this rank has {sum(len(p) for p in parts)} sequences for {n} micro-batches (another rank's "
                "token budget made that many): raise train.max_tokens_per_micro_batch"
            )
        parts[i : i + 1] = list(parts[i].tensor_split(2))
    return parts


def prompt_lengths_of(prompt_ids: Sequence[Sequence[int]]) -> torch.Tensor:
    return torch.tensor([len(p) for p in prompt_ids], dtype=torch.long)
