"""Padding-free micro-batches (train.padding_free): the rows of a micro-batch packed into one sequence.

Each row, its prompt and its counted completion tokens, is laid end to end with the others in one row of
sum(prompt + completion) tokens, its position ids restarting at 0; with no attention mask and no cache,
transformers builds a block-diagonal causal mask from the position ids (masking_utils'
``find_packed_sequence_indices``; flash-attention takes the same position ids as its varlen input),
so no token sees another row and no padding is computed. verl trains padding-free for the same reason:
left-padded micro-batches of mixed lengths spend much of their compute and memory on pad tokens.

Only the positions that predict a completion token reach the LM head (``logits_to_keep`` given as those
indices), through the chunked head as in the padded path. The log-probs, entropies and gradients are
the padded forward's to float tolerance (tests/unit/training/test_packing.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from grpolab.distributed import sequence
from grpolab.models.chunked_head import HeadRequest, head_request
from grpolab.models.loading import autocast_context
from grpolab.models.ulysses_attention import lm_outputs
from grpolab.training.logprobs import _chunked_head, _watched, logprobs_from_logits


def packed_inputs(prompt_ids: Sequence[Sequence[int]], completion_ids: torch.Tensor, completion_mask: torch.Tensor):
    """(input_ids [1, L], position_ids [1, L], keep [K], rows [K], cols [K]) on the completions' device:
    position ``keep[k]`` predicts completion token ``cols[k]`` of row ``rows[k]``. Built on the host, moved
    once."""
    lengths = completion_mask.sum(-1).cpu().tolist()
    completions = completion_ids.cpu().tolist()
    flat: list[int] = []
    positions: list[int] = []
    keep: list[int] = []
    rows: list[int] = []
    cols: list[int] = []
    for i, (prompt, c) in enumerate(zip(prompt_ids, lengths, strict=True)):
        start, p = len(flat), len(prompt)
        flat += [int(t) for t in prompt] + completions[i][:c]
        positions += range(p + c)
        keep += range(start + p - 1, start + p - 1 + c)  # the last prompt token predicts completion token 0
        rows += [i] * c
        cols += range(c)
    device = completion_ids.device
    as_tensor = lambda x: torch.tensor(x, dtype=torch.long).to(device)  # noqa: E731
    return as_tensor([flat]), as_tensor([positions]), as_tensor(keep), as_tensor(rows), as_tensor(cols)


def packed_completion_logprobs(
    model: torch.nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    pad_id: int,
    temperature: float = 1.0,
    autocast_dtype: torch.dtype | None = None,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk: int | None = None,
    into_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``completion_logprobs``'s result (logprobs [n, T], entropy [n, T] or None, zero where the mask is
    False) from one packed forward. ``pad_id`` is unused: nothing is padded."""
    del pad_id
    input_ids, positions, keep, rows, cols = packed_inputs(prompt_ids, completion_ids, completion_mask)
    targets = completion_ids[rows, cols]
    temp = temperature if temperature > 0 else 1.0
    head = _chunked_head(model)
    forward = {"input_ids": input_ids, "position_ids": positions, "attention_mask": None, "use_cache": False,
               "logits_to_keep": keep}  # fmt: skip
    with autocast_context(input_ids.device, autocast_dtype):
        if head is not None:
            request = HeadRequest(targets[None], temp, chunk, into_grad=into_grad and not _watched(model))
            with head_request(head, request):
                out = _logits(model, forward)[0]
            lp, ent = out[:, 0], out[:, 1]
        else:
            logits = _logits(model, forward).float() / temp  # [1, K, V]
            lp, ent = (x[0] for x in logprobs_from_logits(logits, targets[None], entropy_grad=entropy_grad))
    logprobs = completion_ids.new_zeros(completion_ids.shape, dtype=lp.dtype).index_put((rows, cols), lp)
    if not with_entropy:
        return logprobs, None
    ent = ent if entropy_grad else ent.detach()
    return logprobs, torch.zeros_like(logprobs).index_put((rows, cols), ent)


def _logits(model, forward: dict) -> torch.Tensor:
    """The forward's ``logits`` (or the chunked head's pairs); under sequence parallelism from this rank's
    slice of the packed row, every rank then holding all of them (models/ulysses_attention.py)."""
    if sequence.active():
        return lm_outputs(model, forward["input_ids"], forward["position_ids"], None, forward["logits_to_keep"])
    return model(**forward).logits
