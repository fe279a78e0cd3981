"""Per-token log-probs of completion tokens under a model.

    logprobs[:, t] = log softmax(logits / temperature)[completion_ids[:, t]]   given prompt and completion[:, :t]

Layout: prompts left-padded to a common length Sp, completions right-padded, so every completion starts
at column Sp and only the last T+1 positions need logits (``logits_to_keep``). Position ids follow the
attention mask, so padding never shifts positions.

Under bf16 autocast the transformer body runs in bf16 but the output head and the log-softmax run in
fp32: bf16 logits have a resolution of ~0.06 at magnitude 10, too coarse for ratios and KL. Models that
post-process logits (soft-capping, logit scales) take the plain forward path instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from grpolab.models import autocast_context, is_peft

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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs [n, T], entropy [n, T] or None), zero where completion_mask is False.

    Gradients flow when called outside no_grad. Columns past the longest counted completion are not
    computed (no padding waste), and come back as zeros.
    """
    n, t_full = completion_ids.shape
    t = max(int(completion_mask.sum(-1).max().item()), 1)
    ids = completion_ids[:, :t]
    input_ids, attention_mask, position_ids = build_inputs(prompt_ids, ids, pad_id)
    logits = _completion_logits(model, input_ids, attention_mask, position_ids, t, autocast_dtype)
    logits = logits.float() / (temperature if temperature > 0 else 1.0)
    logz = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - logz
    mask = completion_mask[:, :t]
    logprobs = torch.where(mask, logprobs, torch.zeros_like(logprobs))
    entropy = None
    if with_entropy:
        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)
            entropy = torch.where(mask, logz - (probs * logits).sum(-1), torch.zeros_like(logz))
    if t < t_full:
        logprobs = torch.nn.functional.pad(logprobs, (0, t_full - t))
        entropy = None if entropy is None else torch.nn.functional.pad(entropy, (0, t_full - t))
    return logprobs, entropy


def _completion_logits(
    model, input_ids, attention_mask, position_ids, t: int, autocast_dtype
) -> torch.Tensor:
    """Logits [n, t, V] at the positions that predict the t completion tokens."""
    device = input_ids.device
    inner = model.get_base_model() if is_peft(model) else model
    config = inner.config
    fp32_head = autocast_dtype is not None and not any(
        getattr(config, k, None) for k in _LOGIT_POSTPROCESSING
    )
    with autocast_context(device, autocast_dtype):
        if fp32_head:
            out = inner.get_decoder()(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
            )
            hidden = out.last_hidden_state[:, -t - 1 : -1]
        else:
            out = model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=False,
                logits_to_keep=t + 1,
            )
            return out.logits[:, -t - 1 : -1]
    head = inner.get_output_embeddings()
    with torch.autocast(device_type=device.type, enabled=False):
        bias = None if head.bias is None else head.bias.float()
        return torch.nn.functional.linear(hidden.float(), head.weight.float(), bias)
