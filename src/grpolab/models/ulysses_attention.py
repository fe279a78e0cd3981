"""Ulysses attention: a transformers attention function that trades heads for positions over the
sequence-parallel group, runs the model's own attention (sdpa or eager) on whole sequences with 1/N of the
heads, and trades back (grpolab.distributed.sequence; DeepSpeed-Ulysses, arXiv:2309.14509).

It plugs in through transformers' registry, not by patching model classes: ``install`` registers
``grpolab_ulysses_sdpa`` / ``grpolab_ulysses_eager`` in ``AttentionInterface`` (and the inner kind's mask
function in ``AttentionMaskInterface``, so that a forward that is not split, generation, builds its usual
mask and the function simply calls the inner attention) and sets the model's implementation to it. Any
model whose attention layers call ``ALL_ATTENTION_FUNCTIONS.get_interface`` works; one that does not is
refused, as is one whose attention heads do not divide by N (key / value heads that do not are repeated to
the query heads first, so only the query heads must divide).

A split forward (``sharded_outputs``) passes the mask as ``attention_mask={layer type: SequenceShard}``,
the form transformers takes for masks prepared in advance: the shard carries the mask of the WHOLE padded
sequence (causal, and within a packed row or over a padded row's real tokens), which the local slice of the
positions could not give. Because it travels as a layer input, activation checkpointing recomputes with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from grpolab.distributed import sequence
from grpolab.distributed.parallel import unwrap
from grpolab.errors import ConfigError
from grpolab.models.chunked_head import head_request, output_head

PREFIX = "grpolab_ulysses_"
INNER = ("sdpa", "eager")


@dataclass(frozen=True)
class SequenceShard:
    """What the attention function of a split forward needs beyond the local query, key and value."""

    layout: sequence.Layout
    mask: torch.Tensor | None
    """bool [n, 1, S, S] over the whole padded sequence (True: may attend), or None: plainly causal."""


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    for inner in INNER:
        AttentionInterface.register(PREFIX + inner, ulysses_attention)
        AttentionMaskInterface.register(PREFIX + inner, ALL_MASK_ATTENTION_FUNCTIONS[inner])


def install(model: nn.Module, n: int) -> None:
    """Make ``model`` (a transformers model, or one that wraps one as ``.body`` or a PEFT base) run its
    attention through ``ulysses_attention``; a one-line error when it cannot. Call before wrapping."""
    if n == 1:
        return
    inner = _transformers_model(model)
    config = inner.config
    current = getattr(config, "_attn_implementation", None) or "eager"
    if current.startswith(PREFIX):
        return
    name = type(inner).__name__
    if not inner._can_set_attn_implementation():
        raise ConfigError(
            f"train.sequence_parallel={n}: {name} does not use transformers' attention-function registry "
            "(AttentionInterface), so its attention cannot be split over ranks; use train.sequence_parallel=1"
        )
    if current not in INNER:
        raise ConfigError(
            f"train.sequence_parallel={n} wraps the sdpa or eager attention, not {current!r}: set "
            "model.attn_implementation=sdpa (or eager)"
        )
    text = config.get_text_config()
    heads = int(text.num_attention_heads)
    if heads % n:
        raise ConfigError(
            f"train.sequence_parallel={n}: {name} has {heads} attention heads, which do not divide by {n} "
            f"(each rank takes heads / {n}); pick a train.sequence_parallel that divides {heads}"
        )
    if "sliding_attention" in (getattr(text, "layer_types", None) or ()):
        raise ConfigError(
            f"train.sequence_parallel={n}: {name} has sliding-window layers, which the split attention does "
            "not mask; use train.sequence_parallel=1"
        )
    _register()
    inner.set_attn_implementation(PREFIX + current)


def _transformers_model(model: nn.Module) -> nn.Module:
    from transformers import PreTrainedModel

    model = unwrap(model)
    for candidate in (model, getattr(model, "body", None)):
        base = candidate.get_base_model() if hasattr(candidate, "get_base_model") else candidate
        if isinstance(base, PreTrainedModel):
            return base
    raise ConfigError(f"train.sequence_parallel > 1 needs a transformers model, not {type(model).__name__}")


def ulysses_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' attention-function signature: query [b, H, s, d], key / value [b, KV, s, d] ->
    ([b, s, H, d], None). ``s`` is this rank's 1/N of the positions when ``attention_mask`` is a
    SequenceShard; otherwise (an unsplit forward) the inner attention runs as it is."""
    inner = _inner_function(module)
    if not isinstance(attention_mask, SequenceShard):
        return inner(module, query, key, value, attention_mask, **kwargs)
    lay = attention_mask.layout
    if key.shape[1] % lay.size:  # too few key / value heads to split: one per query head
        groups = query.shape[1] // key.shape[1]
        key, value = (x.repeat_interleave(groups, dim=1) for x in (key, value))
        module = _OneGroup(module)
    q, k, v = (sequence.heads_for_positions(x, lay) for x in (query, key, value))
    kwargs.pop("position_ids", None)  # local positions; the mask carries the whole sequence's structure
    mask = attention_mask.mask
    if module.config._attn_implementation.endswith("eager"):
        mask = _additive(mask, q)
    out, _ = inner(module, q, k, v, mask, **kwargs)  # [b, S, H/N, d]
    return sequence.positions_for_heads(out, lay), None


def _inner_function(module) -> Callable:
    name = module.config._attn_implementation.removeprefix(PREFIX)
    if name == "sdpa":
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward
    return sys.modules[type(module).__module__].eager_attention_forward  # the model's own


def _additive(mask: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
    """The eager attention's float mask (0 or the dtype's lowest) from a bool one; causal when None."""
    if mask is None:
        s = q.shape[2]
        mask = torch.ones((s, s), dtype=torch.bool, device=q.device).tril()[None, None]
    return torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, torch.finfo(q.dtype).min)


class _OneGroup:
    """The attention module as the inner function sees it once key / value heads were repeated."""

    num_key_value_groups = 1

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        return getattr(self._module, name)


def plainly_causal(position_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> bool:
    """Whether causal attention alone masks this micro-batch: one packed row (one position 0, first), or
    padded rows without a pad."""
    if attention_mask is None:
        starts = position_ids == 0
        return position_ids.shape[0] == 1 and int(starts.sum()) == 1 and bool(starts[0, 0])
    return bool(attention_mask.bool().all())


def full_mask(position_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """bool [n, 1, S, S] mask of the whole (padded) micro-batch, or None where it is plainly causal.

    Packed rows (no attention mask): a token attends to the earlier tokens of its own row, a row starting
    where the position id is 0 (transformers' find_packed_sequence_indices reads them so). Padded rows: to
    the earlier real tokens; a pad query attends to itself (a row with no key would give NaNs; nothing reads
    a pad position's output)."""
    if plainly_causal(position_ids, attention_mask):
        return None  # no [S, S] tensor at all: at 32K one would be 1 GiB, and sdpa would make it 4 GiB of fp32
    n, s = position_ids.shape
    causal = torch.ones((s, s), dtype=torch.bool, device=position_ids.device).tril()
    if attention_mask is None:
        row = (position_ids == 0).cumsum(-1)
        return (causal & (row[:, :, None] == row[:, None, :]))[:, None]
    eye = torch.eye(s, dtype=torch.bool, device=position_ids.device)
    return ((causal & attention_mask.bool()[:, None, :]) | eye)[:, None]


@dataclass(frozen=True)
class Local:
    """This rank's slice of a micro-batch."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    keep: torch.Tensor
    """Local indices of the kept positions that lie in this slice."""
    mine: torch.Tensor
    """Which of the K kept positions lie in this slice (bool [K])."""
    shard: SequenceShard


def split(input_ids, position_ids, attention_mask, keep: torch.Tensor) -> Local:
    """This rank's slice of ``input_ids`` / ``position_ids`` [n, L], padded at the end to a multiple of N
    (the pad positions come after every real one, so causal attention keeps them out), and of ``keep``
    (global indices of the positions whose outputs are wanted)."""
    lay = sequence.layout()
    n, length = input_ids.shape
    pad = sequence.padded_length(length) - length
    # The end pad comes after every real position, so causal attention alone keeps it out of their outputs
    # (nobody reads a pad's): a micro-batch that was plainly causal stays so, with no [S, S] mask.
    causal_only = plainly_causal(position_ids, attention_mask)
    if pad:
        extra = torch.arange(pad, device=input_ids.device).expand(n, pad)
        # packed: the pad is a row of its own (positions from 0); padded: masked out, positions going on
        more = extra if attention_mask is None else position_ids[:, -1:] + 1 + extra
        input_ids = torch.cat([input_ids, input_ids.new_zeros((n, pad))], dim=1)
        position_ids = torch.cat([position_ids, more], dim=1)
        if attention_mask is not None:
            attention_mask = torch.cat([attention_mask, attention_mask.new_zeros((n, pad))], dim=1)
    start, stop = sequence.bounds(length + pad, lay)
    mine = (keep >= start) & (keep < stop)
    shard = SequenceShard(lay, None if causal_only else full_mask(position_ids, attention_mask))
    return Local(input_ids[:, start:stop], position_ids[:, start:stop], keep[mine] - start, mine, shard)


def masks_for(model: nn.Module, shard: SequenceShard) -> dict[str, SequenceShard]:
    """The ``attention_mask`` argument of a split forward: the shard for every layer type."""
    text = _transformers_model(model).config.get_text_config()
    return dict.fromkeys(getattr(text, "layer_types", None) or ("full_attention",), shard)


def sharded_outputs(call: Callable[[Local], torch.Tensor], input_ids, position_ids, attention_mask, keep) -> torch.Tensor:
    """[n, K, ...]: ``call(local)``'s outputs [n, k, ...] at this rank's kept positions, placed among the K
    kept positions and summed over the group, so every rank holds all of them (sequence.sum_over_group: the
    gradient of each flows back on the rank that computed it)."""
    local = split(input_ids, position_ids, attention_mask, keep)
    out = call(local)
    index = local.mine.nonzero().squeeze(-1)
    full = out.new_zeros((out.shape[0], keep.numel(), *out.shape[2:])).index_copy(1, index, out)
    return sequence.sum_over_group(full)


def lm_outputs(model: nn.Module, input_ids, position_ids, attention_mask, keep: torch.Tensor) -> torch.Tensor:
    """``model(...).logits`` at the K positions ``keep`` [K] of a causal LM's micro-batch [n, L], from a
    split forward: the logits, or what the chunked head returns in their place, [n, K, 2] (log-prob,
    entropy) for the targets [n, K] of its request, of which each rank asks its own positions'."""
    head = output_head(_transformers_model(model))
    request = getattr(head, "request", None)

    def call(local: Local) -> torch.Tensor:
        asked = contextlib.nullcontext()
        if request is not None and request.targets is not None:
            asked = head_request(head, dataclasses.replace(request, targets=request.targets[:, local.mine]))
        with asked:
            out = model(
                input_ids=local.input_ids, position_ids=local.position_ids, attention_mask=masks_for(model, local.shard),
                logits_to_keep=local.keep, use_cache=False,
            )  # fmt: skip
        return out.logits

    return sharded_outputs(call, input_ids, position_ids, attention_mask, keep)
