"""Per-token log-probs of completion tokens under a model.

    logprobs[:, t] = log softmax(logits / temperature)[completion_ids[:, t]]   given prompt and completion[:, :t]

Layout: prompts left-padded to a common length Sp, completions right-padded, so every completion starts
at column Sp and only the last T positions need logits (``logits_to_keep``). Position ids follow the
attention mask, so padding never shifts positions. The last completion token predicts nothing that is
scored, so it is not fed (causal attention: no other position depends on it).

On a CPU in bf16 the plain attention replaces SDPA where its scores are small (grpolab.models.inference).

The log-probs and entropies come out of the LM head itself, chunk by chunk in fp32, without the full
[n, T, V] logits (grpolab.models.chunked_head): the model's forward is called as a whole, so a DDP- or
FSDP2-wrapped model works unchanged. Under bf16 autocast the transformer body runs in bf16 but the head
and the log-softmax run in fp32: bf16 logits have a resolution of ~0.06 at magnitude 10, too coarse for
ratios and KL. Models that post-process logits (soft-capping, logit scales) take the plain path: the
model's own logits (full [n, T, V], in the autocast dtype), then the log-softmax in fp32.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Sequence

import torch

from grpolab.distributed import parallel, sequence
from grpolab.models.chunked_head import (
    ChunkedLMHead,
    HeadRequest,
    head_request,
    install_chunked_head,
    output_head,
)
from grpolab.models.inference import attention_for
from grpolab.models.loading import autocast_context, is_peft
from grpolab.models.ulysses_attention import lm_outputs

_LOGIT_POSTPROCESSING = (
    "final_logit_softcapping",
    "logit_scale",
    "logits_scaling",
    "output_multiplier_scale",
)


def build_inputs(
    prompt_ids: Sequence[Sequence[int]], completion_ids: torch.Tensor, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids [n, Sp+T], attention_mask [n, Sp+T], position_ids [n, Sp+T]) for completion_ids [n, T].

    Padding of the completion (after EOS) is masked out by the caller through completion_mask; it is
    kept in the attention mask here because it only ever follows the tokens that count.
    """
    n, _ = completion_ids.shape
    width = max(len(p) for p in prompt_ids)
    # filled on the host and moved in one copy (row by row into a CUDA tensor is one blocking copy each)
    prompts = torch.full((n, width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, width), dtype=torch.long)
    for i, ids in enumerate(prompt_ids):
        prompts[i, width - len(ids) :] = torch.as_tensor(ids, dtype=torch.long)
        prompt_mask[i, width - len(ids) :] = 1
    prompts, prompt_mask = _to_device(prompts, completion_ids.device), _to_device(prompt_mask, completion_ids.device)
    input_ids = torch.cat([prompts, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, torch.ones_like(completion_ids)], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``: one copy, from pinned memory (asynchronous) on CUDA."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def completion_logprobs(
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
    """(logprobs [n, T], entropy [n, T] or None), zero where completion_mask is False.

    Gradients flow when called outside no_grad; through the entropy only with ``entropy_grad`` (an
    entropy bonus, algo.entropy_coef). Columns past the longest counted completion are not computed (no
    padding waste), and come back as zeros. ``chunk``: tokens per chunk of the LM head (None = about
    64 MiB of fp32 logits; grpolab.models.chunked_head). ``into_grad``: the caller calls ``backward()`` on
    what it computes from these (a training step): the head may then add its weight's gradient straight
    into ``.grad`` (HeadRequest.into_grad; ignored on a DDP- or FSDP2-wrapped model).
    """
    n, t_full = completion_ids.shape
    t = max(int(completion_mask.sum(-1).max().item()), 1)
    ids = completion_ids[:, :t]
    temp = temperature if temperature > 0 else 1.0
    head = _chunked_head(model)
    if head is not None:
        request = HeadRequest(ids, temp, chunk, into_grad=into_grad and not _watched(model), entropy=with_entropy)
        packed = _head_logprobs(model, head, prompt_ids, pad_id, autocast_dtype, request)
        logprobs, entropy = packed[..., 0], packed[..., 1]
    else:
        logits = _completion_logits(model, prompt_ids, ids, pad_id, autocast_dtype)
        logprobs, entropy = logprobs_from_logits(logits.float() / temp, ids, entropy_grad=entropy_grad)
    mask = completion_mask[:, :t]
    logprobs = torch.where(mask, logprobs, torch.zeros_like(logprobs))
    if with_entropy:
        entropy = entropy if entropy_grad else entropy.detach()
        entropy = torch.where(mask, entropy, torch.zeros_like(entropy))
    else:
        entropy = None
    if t < t_full:
        logprobs = torch.nn.functional.pad(logprobs, (0, t_full - t))
        entropy = None if entropy is None else torch.nn.functional.pad(entropy, (0, t_full - t))
    return logprobs, entropy


def logprobs_from_logits(
    logits: torch.Tensor, ids: torch.Tensor, *, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-prob of ``ids`` [n, t], entropy [n, t]) from fp32 logits [n, t, V] (the plain path); the
    entropy carries a gradient only with ``entropy_grad``."""
    logz = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - logz
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = logz - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logprobs, entropy


def _inner(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a DDP wrapper and / or a PEFT model (FSDP2 shards in place). Forward
    calls still go through the wrapper; the inner model is only asked for its config and head."""
    model = parallel.unwrap(model)
    return model.get_base_model() if is_peft(model) else model


def _chunked_head(model) -> ChunkedLMHead | None:
    """The model's ChunkedLMHead, installed now on a model that has none (a model built in code); None for
    models that post-process their logits, or whose head cannot be replaced (or is wrapped by DDP / FSDP2
    already: install it at load, before wrapping): those take the plain path."""
    inner = _inner(model)
    if any(getattr(getattr(inner, "config", None), k, None) for k in _LOGIT_POSTPROCESSING):
        return None
    head = output_head(inner)
    wrapped = parallel.is_wrapped(model) or parallel.is_sharded(inner)
    if head is not None and not isinstance(head, ChunkedLMHead) and not wrapped and install_chunked_head(inner):
        head = output_head(inner)
    return head if isinstance(head, ChunkedLMHead) else None


def _watched(model) -> bool:
    """True when a DDP / FSDP2 wrapper handles the model's gradients (they must reach autograd)."""
    return parallel.is_wrapped(model) or parallel.is_sharded(_inner(model))


def _head_logprobs(model, head, prompt_ids, pad_id, autocast_dtype, request: HeadRequest) -> torch.Tensor:
    """[n, t, 2] (log-prob, entropy) of the t completion tokens ``request.targets``, computed inside the head."""
    ids = request.targets
    inner = _inner(model)
    run = _Forward(model, inner, autocast_dtype)
    prompts, index = _distinct_prompts(prompt_ids, ids.device)
    with autocast_context(ids.device, autocast_dtype):
        if len(prompts) < len(prompt_ids) and run.can_share_prefix() and not parallel.is_wrapped(model):
            return _shared_prefix_forward(run, prompts, index, ids, pad_id, head=(head, request))
        input_ids, attention_mask, position_ids = build_inputs(prompt_ids, ids[:, :-1], pad_id)
        with head_request(head, request):
            return run(input_ids, attention_mask, position_ids, keep=ids.shape[1])


def _completion_logits(model, prompt_ids, ids: torch.Tensor, pad_id: int, autocast_dtype) -> torch.Tensor:
    """Logits [n, t, V] at the t positions that predict the t completion tokens ``ids`` [n, t] (the plain
    path, for models that post-process their logits)."""
    inner = _inner(model)
    run = _Forward(model, inner, autocast_dtype)
    prompts, index = _distinct_prompts(prompt_ids, ids.device)
    with autocast_context(ids.device, autocast_dtype):
        if len(prompts) < len(prompt_ids) and run.can_share_prefix() and not parallel.is_wrapped(model):
            return _shared_prefix_forward(run, prompts, index, ids, pad_id)
        input_ids, attention_mask, position_ids = build_inputs(prompt_ids, ids[:, :-1], pad_id)
        return run(input_ids, attention_mask, position_ids, keep=ids.shape[1])


class _Forward:
    """One forward of the model as a whole (logits, or what the chunked head returns in their place)."""

    def __init__(self, net, inner, autocast_dtype):
        self.net, self.inner, self.autocast_dtype = net, inner, autocast_dtype
        params = inspect.signature(inner.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"  # transformers 5 vs 4

    def can_share_prefix(self) -> bool:
        """transformers turns the cache off under activation checkpointing in training."""
        flag = "is_activation_checkpointing"  # transformers 5; 4.x: is_gradient_checkpointing
        checkpointing = getattr(self.inner, flag if hasattr(self.inner, flag) else "is_gradient_checkpointing", False)
        return not (checkpointing and self.inner.training) and not sequence.active()  # a split forward has no cache

    def __call__(self, input_ids, attention_mask, position_ids, *, keep: int, cache=None) -> torch.Tensor:
        """Outputs [n, keep, ...] of the last ``keep`` positions (keep=0: all)."""
        rows, width = input_ids.shape
        if sequence.active():  # this rank's slice of the positions (models/ulysses_attention.py)
            cols = torch.arange(width - keep if keep else 0, width, device=input_ids.device)
            return lm_outputs(self.net, input_ids, position_ids, attention_mask, cols)
        past = 0 if cache is None else cache.get_seq_length()
        kw = {"use_cache": False} if cache is None else {"use_cache": True, self.cache_arg: cache}
        shape = {"rows": rows, "q_len": width, "kv_len": past + width}
        with attention_for(self.inner, input_ids.device, self.autocast_dtype, **shape):
            out = self.net(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, logits_to_keep=keep, **kw
            )
        return out.logits[:, -keep:] if keep else out.logits


def _distinct_prompts(prompt_ids, device) -> tuple[list[Sequence[int]], torch.Tensor]:
    """(each distinct prompt once, index [n] of every row's prompt in that list)."""
    first: dict[tuple[int, ...], int] = {}
    index = [first.setdefault(tuple(p), len(first)) for p in prompt_ids]
    return [list(p) for p in first], torch.tensor(index, dtype=torch.long, device=device)


def _shared_prefix_forward(run: _Forward, prompts, index: torch.Tensor, ids: torch.Tensor, pad_id: int, head=None):
    """The same outputs as one forward of [prompt, completion], with each distinct prompt run once.

    GRPO repeats each prompt G times: the prompts go through the model once (u rows), their cache is
    expanded to the n rows (differentiably, so gradients from all G completions reach the prompt),
    and the completions run on top of it. With ``head`` = (ChunkedLMHead, HeadRequest for all of ``ids``) the
    outputs are [n, t, 2] (log-prob, entropy): the prompt run returns fp32 logits of its one position
    ([u, V]; the G rows of a prompt predict different tokens there), the completion run asks the head.
    """
    from transformers import DynamicCache

    p_ids, p_mask, p_pos = build_inputs(prompts, ids.new_zeros((len(prompts), 0)), pad_id)
    cache = DynamicCache(config=run.inner.config)
    with _asking(head, None):
        first = run(p_ids, p_mask, p_pos, keep=1, cache=cache)[index]  # predicts completion token 0
    if head is not None:
        # with its entropy's graph, as the head's own entropies have (the caller detaches it without an
        # entropy bonus): else the bonus's gradient missed every completion's first token
        first = torch.stack(logprobs_from_logits(first / head[1].temperature, ids[:, :1], entropy_grad=True), dim=-1)
    if ids.shape[1] == 1:
        return first
    cache.batch_select_indices(index)
    rest = ids[:, :-1]
    mask = torch.cat([p_mask[index], torch.ones_like(rest)], dim=1)
    positions = p_pos[index, -1:] + 1 + torch.arange(rest.shape[1], device=ids.device)
    with _asking(head, ids[:, 1:]):
        return torch.cat([first, run(rest, mask, positions, keep=0, cache=cache)], dim=1)


def _asking(head, targets):
    """head_request for ``head`` = (ChunkedLMHead, HeadRequest) with these ``targets`` (None: fp32 logits),
    or nothing when head is None."""
    if head is None:
        return contextlib.nullcontext()
    module, request = head
    return head_request(module, dataclasses.replace(request, targets=targets))
