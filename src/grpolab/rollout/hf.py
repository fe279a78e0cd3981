"""Sampling G completions per prompt from a transformers causal LM, with the sampling log-probs.

Our own decoding loop over ``model.forward`` with a ``DynamicCache``, not ``model.generate``:
generate only returns per-token scores by keeping [N, V] logits for every step, and GRPO needs just
the log-prob of each sampled token. Each prompt is prefilled once (P rows), the cache and last
logits are then expanded to its G rows, and N rows decode one token per step.

Departures from ``model.generate`` (and why):
- ``logprobs`` are ``log_softmax(logits.float() / temperature)`` of the sampled token over the FULL
  vocabulary: top-k / top-p / min-p and the repetition penalty shape only the distribution we draw from
  (grpolab.rollout.filters). The trainer computes its
  log-probs from ``logits / temperature`` the same way, so the importance ratio is exactly 1 on the
  first update (mu = 1). With temperature 0 (greedy) the log-probs use temperature 1.
- Each token is drawn by the inverse of its row's CDF at one uniform number (grpolab.rollout.filters.draw_tokens):
  the distribution ``torch.multinomial`` draws from, at a fraction of its cost for a real vocabulary, from
  another random stream (a seed gives other samples than ``generate``'s).
- The rows are processed in blocks of ``max_batch_sequences``, or, when that is unset, of as many as a
  KV-cache budget allows (grpolab.rollout.budget); greedy results are identical to one batch, but a
  seeded sampling run draws a different random stream when the rows are split.

Speed on a CPU under bf16 autocast (grpolab.models.inference; measured in benchmarks/README.md): the
sampler decodes from a copy of the model whose Linear weights are stored in bf16, refreshed at every
``sample`` call (autocast would re-cast every weight at every token), with the plain attention
(SDPA's bf16 CPU kernels are slow), and after the prefill each layer's cache moves into buffers
reserved for the whole completion, written in place (grpolab.rollout.hf_cache) (``DynamicCache`` concatenates, copying the
whole cache at every token). For Llama, Qwen2 and Qwen3 models the decode steps skip transformers' forward
(grpolab.rollout.hf_decode: the same modules and operations without the per-token bookkeeping, q/k/v
and gate/up as one product each, a cache grown by blocks, finished rows dropped from the decode, and on CPUs
with AMX the one-token attention as SDPA, whose scores stay in fp32). All of them compute what autocast
computes, but for that attention's rounding.
Elsewhere (fp32, CUDA) the plain ``DynamicCache`` / SDPA path runs. On CUDA no decode step waits for the host: "has every row
stopped?" is asked every ``FINISHED_CHECK_EVERY_CUDA`` tokens, and the attention mask goes in a form
transformers does not inspect (``decode_mask_mode``).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from grpolab.models.inference import WeightCopy, attention_for, eager_calls, wants_eager_attention
from grpolab.models.loading import is_peft
from grpolab.rollout.base import (
    NonFiniteLogits,
    Sampler,
    check_prompts,
    check_sampling,
    resolve_eos,
    sampling_settings,
)
from grpolab.rollout.budget import sequences_per_block
from grpolab.rollout.filters import draw_tokens, filter_logits, penalise_repeats, seen_tokens
from grpolab.rollout.hf_cache import direct_step, reserve, select_rows
from grpolab.types import Completions, FinishReason

FINISHED_CHECK_EVERY_CUDA = 16
"""Decode steps between two host syncs that ask whether every row has stopped, on CUDA (1 on a CPU,
where a sync costs nothing and an extra step would cost a forward)."""


class HFSampler(Sampler):
    """Implements ``grpolab.rollout.base.Sampler`` for a transformers (or PEFT-wrapped) causal LM.

    The returned tensors live on the model's device and are ordinary tensors (not inference
    tensors), so the trainer can index with them under autograd. It reads the live model: no weight
    versions, nothing held back (the contract's defaults).
    """

    takes_examples = False
    streams_groups = False

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        *,
        max_completion_length: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        autocast_dtype: torch.dtype | None = None,
        eos_token_ids: Sequence[int] | None = None,
        max_batch_sequences: int | None = None,
        cast_weights: bool | None = None,
        kv_cache_budget_bytes: int | None = None,
    ) -> None:
        """``cast_weights``: sample from a copy whose Linear weights are stored in ``autocast_dtype``
        (refreshed from the model at each call; one more copy of those weights in memory). None = on
        for a CPU model under autocast without LoRA. ``max_batch_sequences`` None: derived at each call
        from ``kv_cache_budget_bytes`` (None = a share of the free memory; grpolab.rollout.budget)."""
        check_sampling(
            max_completion_length=max_completion_length, temperature=temperature, top_p=top_p, top_k=top_k,
            min_p=min_p, repetition_penalty=repetition_penalty,
        )  # fmt: skip
        if max_batch_sequences is not None and max_batch_sequences < 1:
            raise ValueError(f"max_batch_sequences must be >= 1 or None, got {max_batch_sequences}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_completion_length = max_completion_length
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.min_p = min_p
        self.repetition_penalty = repetition_penalty
        self.autocast_dtype = autocast_dtype
        self.max_batch_sequences = max_batch_sequences
        self.kv_cache_budget_bytes = kv_cache_budget_bytes
        self.eos_token_ids = resolve_eos(model, tokenizer, eos_token_ids)
        self.pad_token_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        )
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        params = inspect.signature(base.forward).parameters
        # transformers >= 5 names the cache argument `cache`; 4.x calls it `past_key_values`.
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._prefill_extra = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self._config = base.config
        if cast_weights is None:
            on_cpu = next(model.parameters()).device.type == "cpu"
            cast_weights = autocast_dtype is not None and on_cpu and not is_peft(model)
        self._weights = WeightCopy(model, autocast_dtype) if cast_weights and autocast_dtype else None
        self._net = model
        """The module that runs the forward passes: the model, or its low-precision copy."""

    def sample(
        self,
        prompt_ids: list[list[int]],
        *,
        num_generations: int,
        generator: torch.Generator | None = None,
    ) -> Completions:
        """G completions for each prompt, prompt-major (row p*G + g is sample g of prompt p)."""
        device = next(self.model.parameters()).device
        _check_inputs(prompt_ids, num_generations, generator, device)
        n = len(prompt_ids) * num_generations
        block = self.max_batch_sequences or self._block(prompt_ids, device)
        was_training = self.model.training
        self.model.eval()
        self._net = self._weights.refresh() if self._weights is not None else self.model
        self._nonfinite = torch.zeros((), dtype=torch.bool, device=device)  # set by _pick, read once below
        try:
            with torch.inference_mode(), self._autocast(device), eager_calls(self._net):
                parts = [
                    self._sample_rows(prompt_ids, start, min(start + block, n), num_generations, generator)
                    for start in range(0, n, block)
                ]
        finally:
            self.model.train(was_training)
            if self._weights is not None:
                self._weights.release()
        if bool(self._nonfinite):  # one host sync per call, not per token
            raise NonFiniteLogits(
                "the model's logits were NaN or infinite while sampling (NaN or infinite weights, or an overflow "
                "in model.dtype float16)"
            )
        ids, mask, logprobs = _concat_right_padded(parts, self.pad_token_id)
        return self._package(prompt_ids, num_generations, ids, mask, logprobs)

    def update_weights(self, model: torch.nn.Module) -> None:
        """Nothing to do: every ``sample`` reads the live model (and refreshes its low-precision copy)."""

    def close(self) -> None:
        """Nothing to release."""

    def _block(self, prompt_ids, device: torch.device) -> int:
        """Sequences per block from the KV-cache budget (rollout.kv_cache_budget_mb or free memory)."""
        tokens = max(len(p) for p in prompt_ids) + self.max_completion_length
        dtype = self.autocast_dtype or next(self.model.parameters()).dtype
        return sequences_per_block(
            self._config,
            tokens=tokens,
            dtype_bytes=torch.finfo(dtype).bits // 8,
            device=device,
            budget_bytes=self.kv_cache_budget_bytes,
        )

    def _autocast(self, device: torch.device):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.autocast_dtype)

    def _sample_rows(self, prompt_ids, start: int, stop: int, group: int, generator):
        """Rows [start, stop) of the N rows: prefill their distinct prompts once, then decode."""
        first, last = start // group, (stop - 1) // group
        cache, logits, attention = self._prefill(prompt_ids[first : last + 1])
        rows = torch.arange(start, stop, device=logits.device) // group - first  # [n] -> prompt
        capacity = attention.shape[1] + self.max_completion_length
        shape = {"rows": stop - start, "q_len": 1, "kv_len": capacity}
        reserved = wants_eager_attention(self._net, logits.device, self.autocast_dtype, **shape)
        step = None
        if reserved:  # measured: pays off with the plain attention only
            step = direct_step(self._net, cache, rows, attention[rows], capacity, self.autocast_dtype)
            if step is None:
                reserve(cache, rows, capacity, self.autocast_dtype)
        else:
            select_rows(cache, rows)
        padded = len({len(p) for p in prompt_ids[first : last + 1]}) > 1
        mode = decode_mask_mode(logits.device, self._config, padded=padded, reserved=reserved)
        repeats = None
        if self.repetition_penalty != 1.0:  # the prompt's own tokens, then each sampled one
            repeats = seen_tokens(prompt_ids[first : last + 1], rows, logits.shape[-1])
        return self._decode(logits[rows], cache, attention[rows], generator, mode, repeats, step)

    def _prefill(self, prompts: list[list[int]]):
        """Left-padded forward of the prompts; returns the cache, last logits [P, V], mask [P, S]."""
        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention[i, width - len(p) :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)  # equal to an unpadded forward
        cache = DynamicCache(config=self._config)
        rows, width = input_ids.shape
        with attention_for(self._net, device, self.autocast_dtype, rows=rows, q_len=width, kv_len=width):
            out = self._forward(input_ids, attention, positions, cache, **self._prefill_extra)
        return cache, out.logits[:, -1], attention

    def _forward(self, input_ids, attention, positions, cache, **extra):
        return self._net(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            **{self._cache_arg: cache},
            **extra,
        )

    def _decode(self, logits, cache, prompt_attention, generator, mask_mode: str = "2d", repeats=None, step=None):
        """One token per step for n rows until every row emitted EOS or the length limit; ``mask_mode`` is
        how each step passes the attention mask (``decode_mask_mode``); ``repeats`` [n, V] bool, the tokens the
        repetition penalty applies to (None without one), grows in place; ``step`` a ``DirectDecoder`` over
        ``cache`` that replaces the model's forward (None: the forward)."""
        n, steps, device = logits.shape[0], self.max_completion_length, logits.device
        ids = torch.full((n, steps), self.pad_token_id, dtype=torch.long, device=device)
        logprobs = torch.zeros((n, steps), dtype=torch.float32, device=device)
        mask = torch.zeros((n, steps), dtype=torch.bool, device=device)
        prompt_width = prompt_attention.shape[1]
        attention = torch.cat([prompt_attention, prompt_attention.new_ones(n, steps)], dim=1)
        if mask_mode == "4d":
            attention = attention.bool()[:, None, None, :]  # [n, 1, 1, kv]: SDPA's boolean mask, True = attend
        next_position = prompt_attention.sum(-1, keepdim=True)  # [n, 1]
        eos = torch.tensor(self.eos_token_ids, dtype=torch.long, device=device)
        finished = torch.zeros(n, dtype=torch.bool, device=device)
        kv_len = prompt_width + steps
        check_every = finished_check_every(device)
        live = None  # the rows still decoded, where the direct step drops finished ones (None: all n)
        with attention_for(self._net, device, self.autocast_dtype, rows=n, q_len=1, kv_len=kv_len):
            for t in range(steps):
                token, token_logprob = self._pick(logits, generator, repeats, live, n)
                if repeats is not None:
                    repeats.scatter_(1, token[:, None], True)
                at = slice(None) if live is None else live
                active = ~finished[at]
                ids[at, t] = torch.where(active, token, self.pad_token_id)
                logprobs[at, t] = torch.where(active, token_logprob, 0.0)
                mask[at, t] = active
                finished[at] = ~active | torch.isin(token, eos)
                # "has every row stopped?" is a host sync: on CUDA asked every few tokens, so the launch
                # queue stays full (the extra steps' tokens are masked out and trimmed below)
                if t + 1 == steps or ((t + 1) % check_every == 0 and bool(finished.all())):
                    break
                if step is not None:
                    if check_every == 1:  # a CPU, where the host reads ``finished`` anyway: drop finished rows
                        keep = step.drop_finished(finished[at])
                        if keep is not None:
                            live = keep if live is None else live[keep]
                            at, repeats = live, None if repeats is None else repeats[keep]
                    logits = step(ids[at, t : t + 1], next_position[at] + t)
                    continue
                seen = None if mask_mode == "none" else attention[..., : prompt_width + t + 1]
                logits = self._forward(ids[:, t : t + 1], seen, next_position + t, cache).logits[:, -1]
        width = t + 1 if check_every == 1 else int(mask.any(0).nonzero().max()) + 1  # nonzero: row 0 always samples
        return ids[:, :width], mask[:, :width], logprobs[:, :width]

    def _pick(self, logits: torch.Tensor, generator, repeats: torch.Tensor | None = None, live=None, total: int = 0):
        """[n, V] logits -> sampled token [n] and its log-prob [n] under softmax(logits / T). The repetition
        penalty (on the raw logits, before T) and the top-k / top-p / min-p filters shape only the draw.
        ``live``: which of ``total`` rows the logits' rows are (``filters.draw_tokens``; None: all)."""
        logits = logits.float()
        drawn = logits if repeats is None else penalise_repeats(logits, repeats, self.repetition_penalty)
        if self.temperature == 0:
            token = drawn.argmax(-1)
            logprobs = torch.log_softmax(logits, dim=-1)
        else:
            scaled = logits / self.temperature if self.temperature != 1 else logits  # x / 1 is x: one pass less
            logprobs = torch.log_softmax(scaled, dim=-1)
            draw = scaled if repeats is None else drawn / self.temperature
            filtered = filter_logits(draw, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)
            probs = logprobs.exp() if filtered is scaled else torch.softmax(filtered, dim=-1)
            # a row whose logits hold NaN or +inf (or are all -inf) is NaN throughout: drawn uniformly here
            # (a NaN distribution has no CDF), and sample() raises after the loop
            token = draw_tokens(probs.nan_to_num_(nan=1.0), generator, live, total)
        self._nonfinite |= logprobs[:, 0].isnan().any()  # O(rows), no host sync
        return token, logprobs.gather(-1, token[:, None]).squeeze(-1)

    def _package(self, prompt_ids, group, ids, mask, logprobs) -> Completions:
        eos = torch.tensor(self.eos_token_ids, dtype=torch.long, device=ids.device)
        stopped = (torch.isin(ids, eos) & mask).any(-1).tolist()
        lengths = mask.sum(-1).tolist()
        rows = ids.tolist()
        text_ids = [row[: n - int(s)] for row, n, s in zip(rows, lengths, stopped, strict=True)]
        reasons: list[FinishReason] = ["stop" if s else "length" for s in stopped]
        return Completions(
            prompt_ids=[list(p) for p in prompt_ids for _ in range(group)],
            completion_ids=ids,
            completion_mask=mask,
            logprobs=logprobs,
            texts=self.tokenizer.batch_decode(text_ids, skip_special_tokens=True),
            finish_reasons=reasons,
            num_generations=group,
        )


def sampler_from_config(
    model: torch.nn.Module,
    tokenizer,
    rollout,
    *,
    autocast_dtype: torch.dtype | None,
    temperature: float | None = None,
    cast_weights: bool | None = None,
) -> HFSampler:
    """An HFSampler with the settings of a ``RolloutConfig``; ``temperature`` overrides it (evaluation)."""
    return HFSampler(
        model,
        tokenizer,
        **sampling_settings(rollout, temperature),
        autocast_dtype=autocast_dtype,
        max_batch_sequences=rollout.max_batch_sequences,
        cast_weights=cast_weights,
        kv_cache_budget_bytes=None if rollout.kv_cache_budget_mb is None else int(rollout.kv_cache_budget_mb * 2**20),
    )


def _check_inputs(prompt_ids, num_generations: int, generator, device: torch.device) -> None:
    check_prompts(prompt_ids, num_generations)
    if generator is not None and generator.device.type != device.type:
        raise ValueError(
            f"generator is on {generator.device} but the model on {device}: create it on {device}"
        )


def _concat_right_padded(parts, pad_token_id: int):
    """Concatenate (ids, mask, logprobs) blocks along rows, right-padding to the longest T."""
    width = max(ids.shape[1] for ids, _, _ in parts)

    def pad(x: torch.Tensor, value) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    # Outside inference mode: cat returns ordinary tensors that autograd can save (e.g. as gather index).
    ids = torch.cat([pad(p[0], pad_token_id) for p in parts])
    mask = torch.cat([pad(p[1], False) for p in parts])
    logprobs = torch.cat([pad(p[2], 0.0) for p in parts])
    return ids, mask, logprobs


def decode_mask_mode(device: torch.device, config, *, padded: bool, reserved: bool) -> str:
    """How the decode steps pass the attention mask on ``device``.

    "2d", the [n, kv] padding mask, from which transformers builds the attention's mask. Under SDPA it
    first asks whether any key is masked (``padding_mask.all()``), a host sync at every token: free on a
    CPU, a stall of the launch queue on CUDA. So on CUDA, where no prompt row is padded, "none" (every key
    is attended: no mask at all), and where rows are padded under SDPA, "4d": SDPA's own boolean
    [n, 1, 1, kv] mask, made once per batch and sliced per token, which transformers passes through as it
    is. The reserved cache (grpolab.rollout.hf_cache.ReservedLayer, CPU only) needs the 2-D mask to hide its
    unwritten slots; flash-attention unpads a padded batch by itself (its own sync) and takes 2-D masks.
    """
    if device.type != "cuda" or reserved:
        return "2d"
    if not padded:
        return "none"
    return "4d" if getattr(config, "_attn_implementation", None) == "sdpa" else "2d"


def finished_check_every(device: torch.device) -> int:
    return FINISHED_CHECK_EVERY_CUDA if device.type == "cuda" else 1
