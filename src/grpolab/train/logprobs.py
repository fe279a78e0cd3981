"""Per-token log-probs of completion tokens under a model.

    logprobs[:, t] = log softmax(logits / temperature)[completion_ids[:, t]]   given prompt and completion[:, :t]

Layout: prompts left-padded to a common length Sp, completions right-padded, so every completion starts
at column Sp and only the last T positions need logits (``logits_to_keep``). Position ids follow the
attention mask, so padding never shifts positions. The last completion token predicts nothing that is
scored, so it is not fed (causal attention: no other position depends on it).

On a CPU in bf16 the plain attention replaces SDPA where its scores are small (grpolab.inference).

Under bf16 autocast the transformer body runs in bf16 but the output head and the log-softmax run in
fp32: bf16 logits have a resolution of ~0.06 at magnitude 10, too coarse for ratios and KL. Models that
post-process logits (soft-capping, logit scales) take the plain forward path instead.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch

from grpolab.inference import attention_for
from grpolab.models import autocast_context, is_peft
from grpolab.run.parallel import is_wrapped, unwrap

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
    device = completion_ids.device
    prompts = torch.full((n, width), pad_id, dtype=torch.long, device=device)
    prompt_mask = torch.zeros((n, width), dtype=torch.long, device=device)
    for i, ids in enumerate(prompt_ids):
        prompts[i, width - len(ids) :] = torch.as_tensor(ids, dtype=torch.long)
        prompt_mask[i, width - len(ids) :] = 1
    input_ids = torch.cat([prompts, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, torch.ones_like(completion_ids)], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs [n, T], entropy [n, T] or None), zero where completion_mask is False.

    Gradients flow when called outside no_grad; through the entropy only with ``entropy_grad`` (an
    entropy bonus, algo.entropy_coef), since that keeps a second [n, T, V] softmax in the graph.
    Columns past the longest counted completion are not computed (no padding waste), and come back
    as zeros.
    """
    n, t_full = completion_ids.shape
    t = max(int(completion_mask.sum(-1).max().item()), 1)
    ids = completion_ids[:, :t]
    logits = _completion_logits(model, prompt_ids, ids, pad_id, autocast_dtype)
    logits = logits.float() / (temperature if temperature > 0 else 1.0)
    logz = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - logz
    mask = completion_mask[:, :t]
    logprobs = torch.where(mask, logprobs, torch.zeros_like(logprobs))
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            probs = torch.softmax(logits, dim=-1)
            entropy = torch.where(mask, logz - (probs * logits).sum(-1), torch.zeros_like(logz))
    if t < t_full:
        logprobs = torch.nn.functional.pad(logprobs, (0, t_full - t))
        entropy = None if entropy is None else torch.nn.functional.pad(entropy, (0, t_full - t))
    return logprobs, entropy


def _completion_logits(model, prompt_ids, ids: torch.Tensor, pad_id: int, autocast_dtype) -> torch.Tensor:
    """Logits [n, t, V] at the t positions that predict the t completion tokens ``ids`` [n, t]."""
    device = ids.device
    # A DDP / FSDP model is called as a whole (its hooks sync gradients and gather shards): no separate
    # fp32 head on the decoder's features, and one forward per backward (no shared-prompt pass).
    wrapped = is_wrapped(model)
    inner = unwrap(model)
    inner = inner.get_base_model() if is_peft(inner) else inner
    fp32_head = autocast_dtype is not None and not wrapped and not any(
        getattr(inner.config, k, None) for k in _LOGIT_POSTPROCESSING
    )
    run = _Forward(inner.get_decoder() if fp32_head else model, inner, fp32_head, autocast_dtype)
    prompts, index = _distinct_prompts(prompt_ids, device)
    with autocast_context(device, autocast_dtype):
        if len(prompts) < len(prompt_ids) and run.can_share_prefix() and not wrapped:
            features = _shared_prefix_forward(run, prompts, index, ids, pad_id)
        else:
            input_ids, attention_mask, position_ids = build_inputs(prompt_ids, ids[:, :-1], pad_id)
            features = run(input_ids, attention_mask, position_ids, keep=ids.shape[1])
    if not fp32_head:
        return features
    head = inner.get_output_embeddings()
    with torch.autocast(device_type=device.type, enabled=False):
        bias = None if head.bias is None else head.bias.float()
        return torch.nn.functional.linear(features.float(), head.weight.float(), bias)


class _Forward:
    """One forward of the decoder (hidden states, for the fp32 head) or of the model (logits)."""

    def __init__(self, net, inner, hidden: bool, autocast_dtype):
        self.net, self.inner, self.hidden, self.autocast_dtype = net, inner, hidden, autocast_dtype
        params = inspect.signature(net.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"  # transformers 5 vs 4

    def can_share_prefix(self) -> bool:
        """transformers turns the cache off under activation checkpointing in training."""
        flag = "is_activation_checkpointing"  # transformers 5; 4.x: is_gradient_checkpointing
        checkpointing = getattr(self.inner, flag if hasattr(self.inner, flag) else "is_gradient_checkpointing", False)
        return not (checkpointing and self.inner.training)

    def __call__(self, input_ids, attention_mask, position_ids, *, keep: int, cache=None) -> torch.Tensor:
        """Features [n, keep, F] of the last ``keep`` positions (keep=0: all)."""
        rows, width = input_ids.shape
        past = 0 if cache is None else cache.get_seq_length()
        kw = {"use_cache": False} if cache is None else {"use_cache": True, self.cache_arg: cache}
        if not self.hidden:
            kw["logits_to_keep"] = keep
        shape = {"rows": rows, "q_len": width, "kv_len": past + width}
        with attention_for(self.inner, input_ids.device, self.autocast_dtype, **shape):
            out = self.net(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kw)
        features = out.last_hidden_state if self.hidden else out.logits
        return features[:, -keep:] if keep else features


def _distinct_prompts(prompt_ids, device) -> tuple[list[Sequence[int]], torch.Tensor]:
    """(each distinct prompt once, index [n] of every row's prompt in that list)."""
    first: dict[tuple[int, ...], int] = {}
    index = [first.setdefault(tuple(p), len(first)) for p in prompt_ids]
    return [list(p) for p in first], torch.tensor(index, dtype=torch.long, device=device)


def _shared_prefix_forward(run: _Forward, prompts, index: torch.Tensor, ids: torch.Tensor, pad_id: int):
    """The same features as one forward of [prompt, completion], with each distinct prompt run once.

    GRPO repeats each prompt G times: the prompts go through the model once (u rows), their cache is
    expanded to the n rows (differentiably, so gradients from all G completions reach the prompt),
    and the completions run on top of it.
    """
    from transformers import DynamicCache

    p_ids, p_mask, p_pos = build_inputs(prompts, ids.new_zeros((len(prompts), 0)), pad_id)
    cache = DynamicCache(config=run.inner.config)
    first = run(p_ids, p_mask, p_pos, keep=1, cache=cache)[index]  # predicts completion token 0
    if ids.shape[1] == 1:
        return first
    cache.batch_select_indices(index)
    rest = ids[:, :-1]
    mask = torch.cat([p_mask[index], torch.ones_like(rest)], dim=1)
    positions = p_pos[index, -1:] + 1 + torch.arange(rest.shape[1], device=ids.device)
    return torch.cat([first, run(rest, mask, positions, keep=0, cache=cache)], dim=1)
