"""One decode step of a Llama, Qwen2 or Qwen3 causal LM run straight from its modules, over a cache of its own.

At 32 rows of a small model a decode step's products take ~13 ms and transformers' forward around them
another ~10: the attention mask rebuilt at every token, the cache's update calls, the rotary embedding's
``rotate_half`` per tensor, ``repeat_kv`` (a copy of the whole cache per layer where keys are shared by
several heads), the attention output's transpose copy, ~110 module calls and the output records
(benchmarks/README.md has the profile). ``DirectDecoder`` runs the same modules and the same operations in
the same dtypes, minus that bookkeeping: the additive mask is made once per batch and one slot is opened per
token, the new key and value are written in place, and the query heads that share a key head multiply with
it as one [heads/kv-heads, head_dim] block instead of against a repeated copy.

Its cache grows by ``WINDOW_BLOCK`` slots at a time instead of being reserved for the whole completion: the
attention's products read every slot of the buffers they are given (unwritten ones are masked), and on a CPU
the keys and values of all layers do not stay in cache, so a buffer sized to the tokens so far is read
faster (one decode's attention 3.6 -> 2.4 ms per step on the bench model; a view of a longer bf16 buffer would
be copied by the matmul at every call). It exists only for the layer classes whose forward it follows
(``DIRECT_LAYERS``); every other model takes transformers' forward.

On a CPU with AMX the one-token attention is PyTorch's SDPA (its flash kernel multiplies with AMX tiles: about
half the time of the batched products at 32 rows; ``grpolab.models.inference.fused_decode_attention``), with
the scores kept in fp32 where the eager attention rounds them to bf16. And rows that emitted their EOS leave
the decode (``drop_finished``) once they are ``DROP_FRACTION`` of its rows: the sampler feeds only the others,
so a batch whose completions end early stops paying for the finished ones (the Linears read their weights
once a step whatever the rows, but the attention, norms, rotary and sampling scale with them).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from grpolab.models.inference import fused_decode_attention, linear_group
from grpolab.models.lean_ops import LEAN_EAGER

WINDOW_BLOCK = 16
"""Slots by which the direct decoder's cache grows (each growth copies the cache once)."""

DROP_FRACTION = 0.125
"""Finished rows are dropped from the decode once they are this fraction of its rows (``drop_finished``)."""

DIRECT_LAYERS = {
    "LlamaDecoderLayer": ("LlamaAttention", "LlamaMLP"),
    "Qwen2DecoderLayer": ("Qwen2Attention", "Qwen2MLP"),
    "Qwen3DecoderLayer": ("Qwen3Attention", "Qwen3MLP"),
}
"""Decoder-layer classes (by name, transformers 4.5x-5.x) whose decode step ``DirectDecoder`` reproduces, with
the attention and MLP classes each must hold. Qwen3's attention is Llama's with an RMSNorm over each query and
key head (``q_norm``, ``k_norm``) before the rotary embedding."""


def direct_decoder(
    model: torch.nn.Module, prompt_cache, prompt_attention: torch.Tensor, capacity: int, dtype: torch.dtype
) -> DirectDecoder | None:
    """A ``DirectDecoder`` for ``model`` starting from ``prompt_cache`` (one (keys, values) pair per layer,
    [n, kv_heads, prompt width, head_dim]) with room for ``capacity`` tokens in all, its cache in ``dtype``; or
    None where ``model`` is not a plain stack of ``DIRECT_LAYERS`` with full attention in every layer. It
    computes the plain attention, which the sampler decodes with wherever it reserves a cache
    (grpolab.models.inference.wants_eager_attention)."""
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    config = getattr(model, "config", None)
    if layers is None or config is None or len(layers) != len(prompt_cache) or model.training:
        return None
    # sdpa or eager (or its lean form): the plain attention replaces either for decoding (grpolab.models.inference);
    # a flash, flex or custom kernel is kept by the sampler, so it is not this module's to replace
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager", LEAN_EAGER) or not hasattr(base, "rotary_emb"):
        return None
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return None
    for layer in layers:
        parts = DIRECT_LAYERS.get(type(layer).__name__)
        if parts is None or (type(layer.self_attn).__name__, type(layer.mlp).__name__) != parts:
            return None
        if getattr(layer.self_attn, "sliding_window", None) is not None:  # a window the layer types did not name
            return None
    return DirectDecoder(model, prompt_cache, prompt_attention, capacity, dtype)


class DirectDecoder:
    """Feeds one token per row through ``model`` (see the module docstring), writing the next cache slot.

    Numerics: each operation is transformers' own, in its dtype under autocast (norms, rotary, residuals and the
    softmax in fp32; the products in the Linears' and the cache's dtype), with the same additive mask
    (0 or the mask dtype's minimum); with SDPA (AMX) the attention's scores stay in fp32 instead of being
    rounded to bf16. tests/unit/rollout/test_hf_decode.py compares the log-probs with transformers' forward
    (the batched products: the same to 1e-5) and with float64 (SDPA: as close as transformers' bf16 forward)."""

    def __init__(self, model: torch.nn.Module, prompt_cache, prompt_attention: torch.Tensor, capacity: int, dtype):
        self.model = model
        self.base = model.model
        n, width = prompt_attention.shape
        self.fused = fused_decode_attention(prompt_attention.device, dtype)
        # the batched products add the mask as transformers does, in the embeddings' dtype; SDPA takes the query's
        mask_dtype = dtype if self.fused else self.base.embed_tokens.weight.dtype
        self.mask = torch.full((n, 1, 1, capacity), torch.finfo(mask_dtype).min, dtype=mask_dtype,
                               device=prompt_attention.device)  # fmt: skip
        self.mask[:, 0, 0, :width].masked_fill_(prompt_attention.bool(), 0.0)
        self.filled = width
        self.cache = [(keys.to(dtype), values.to(dtype)) for keys, values in prompt_cache]  # grown at the first step
        self.products = [_products(layer) for layer in self.base.layers]

    def _grow(self) -> None:
        """Widen every layer's buffers to the next ``WINDOW_BLOCK`` multiple past the filled slots (zeros: a
        masked slot still enters the products, and 0 x NaN would be NaN)."""
        capacity = self.mask.shape[-1]
        if self.filled >= capacity:
            raise RuntimeError(f"the decode cache holds {self.filled} tokens: no slot is left for another")
        width = min(capacity, (self.filled // WINDOW_BLOCK + 1) * WINDOW_BLOCK)
        for i, old in enumerate(self.cache):  # layer by layer: one layer's old buffers alive at a time
            pair = tuple(x.new_empty((*x.shape[:2], width, x.shape[3])) for x in old)
            for new, x in zip(pair, old, strict=True):
                new[:, :, : self.filled] = x[:, :, : self.filled]
                new[:, :, self.filled :].zero_()
            self.cache[i] = pair
        del old

    def drop_finished(self, finished: torch.Tensor) -> torch.Tensor | None:
        """Drop the rows where ``finished`` [n] is True once they are at least ``DROP_FRACTION`` of the rows (a
        copy of the rest of the cache, repaid by the steps that no longer compute them); returns the kept
        rows' indices [m], or None where nothing was dropped. The caller then feeds the kept rows only."""
        done = int(finished.sum())
        if done == 0 or done < DROP_FRACTION * finished.numel():
            return None
        keep = (~finished).nonzero().squeeze(-1)
        for i, (keys, values) in enumerate(self.cache):  # layer by layer: one layer's old rows alive at a time
            self.cache[i] = (keys[keep], values[keep])
        del keys, values
        self.mask = self.mask[keep]
        return keep

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[n, 1] token ids at [n, 1] positions -> the next-token logits [n, V]."""
        slot = self.filled
        if slot >= self.cache[0][0].shape[2]:
            self._grow()
        self.mask[..., slot] = 0.0
        mask = self.mask[..., : self.cache[0][0].shape[2]]
        hidden = self.base.embed_tokens(input_ids)  # a new tensor: the residual stream is added to in place
        cos, sin = self.base.rotary_emb(hidden, positions)  # [n, 1, head_dim] in the embeddings' dtype
        half = sin.shape[-1] // 2
        # rotate_half(x) * sin == swap_halves(x) * [-sin_1, sin_2]: the same products, one sign moved
        rotary = cos[:, None], torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)[:, None]
        for layer, products, (keys, values) in zip(self.base.layers, self.products, self.cache, strict=True):
            hidden = self._layer(layer, products, hidden, rotary, mask, keys, values, slot)
        self.filled = slot + 1
        return self.model.lm_head(self.base.norm(hidden))[:, -1]

    def _layer(self, layer, products, hidden, rotary, mask, keys, values, slot: int) -> torch.Tensor:
        attn, (qkv, gate_up) = layer.self_attn, products
        n, kv_heads, width, head_dim = keys.shape  # width: the cache's slots so far (``_grow``)
        x = qkv(layer.input_layernorm(hidden))  # [n, 1, (heads + 2 kv_heads) * head_dim]
        heads = x.shape[-1] // head_dim - 2 * kv_heads
        qk = x[..., : (heads + kv_heads) * head_dim].view(n, -1, 1, head_dim)
        if hasattr(attn, "q_norm"):  # Qwen3: each head normalised (fp32 out, as transformers' RMSNorm returns it)
            qk = torch.cat([attn.q_norm(qk[:, :heads]), attn.k_norm(qk[:, heads:])], dim=1)
        qk = _rotate(qk, *rotary)
        keys[:, :, slot] = qk[:, heads:, 0]
        values[:, :, slot] = x[..., (heads + kv_heads) * head_dim :].view(n, kv_heads, head_dim)
        q = qk[:, :heads].to(keys.dtype)  # [n, heads, 1, d]
        if self.fused:
            gqa = heads != kv_heads
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling, enable_gqa=gqa)
        else:  # the query heads that share a key head multiply with it as one [group, d] block: no repeated keys
            group = heads // kv_heads
            scores = torch.matmul(q.view(n, kv_heads, group, head_dim), keys.transpose(2, 3)) * attn.scaling
            scores = scores.view(n, heads, 1, width) + mask
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(qk.dtype)
            out = torch.matmul(probs.to(values.dtype).view(n, kv_heads, group, width), values)
        # [n, heads, 1, d] and [n, kv, group, d] are both [n, 1, heads * d] in memory
        hidden = hidden.add_(attn.o_proj(out.view(n, 1, -1)))
        x = gate_up(layer.post_attention_layernorm(hidden))
        gate, up = x.chunk(2, dim=-1)
        return hidden.add_(layer.mlp.down_proj(layer.mlp.act_fn(gate).mul_(up)))


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """transformers' ``x * cos + rotate_half(x) * sin`` for [n, heads, 1, d] ``x``, the product in ``cos``'s dtype
    (as type promotion makes it from a bf16 ``x``)."""
    x = x.to(cos.dtype)
    swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)
    return x * cos + swapped * signed_sin


def _products(layer):
    """The layer's (q|k|v, gate|up) products: the packed groups where the copy has them, else concatenations."""
    attn, mlp = layer.self_attn, layer.mlp
    parts = ((attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj))
    return tuple(linear_group(*p) or functools.partial(_side_by_side, p) for p in parts)


def _side_by_side(modules, x: torch.Tensor) -> torch.Tensor:
    return torch.cat([m(x) for m in modules], dim=-1)
