"""Llama-family blocks that keep less for the backward: the same forward, less memory.

A training step's peak on a CPU is the micro-batch's saved activations (measured on SmolLM2-135M under bf16
autocast, 32 rows of ~42 tokens: 1.9 GB, 47 KB per token and layer). transformers' blocks keep more than their
backward needs, because autograd saves what every op needs, and every cast and repeat is an op:

- RMSNorm, ``weight * (x * rsqrt(mean(x^2) + eps)).to(dtype)`` with an fp32 residual stream: autograd keeps
  ``x`` and the normalised ``x`` (two fp32 [tokens, H] tensors a norm). ``RMSNormFn`` keeps ``x`` and the
  per-token rsqrt and recomputes the normalised ``x`` in the backward.
- SwiGLU, ``down(silu(gate(x)) * up(x))``: each Linear casts ``x`` to bf16 and keeps its own cast, and autograd
  keeps ``gate(x)``, ``silu(gate(x))``, ``up(x)`` and the product. ``SwiGLUFn`` keeps one cast of ``x``,
  ``gate(x)`` and ``up(x)``, and recomputes the rest in the backward (``SiluMulFn``, the product alone, where
  the projections are LoRA-wrapped or biased).
- q, k, v: three Linears on one input, three casts kept. ``_PackedProjections`` makes them one product (one
  cast, one input-gradient product) in a training forward.
- Eager attention: ``repeat_kv`` copies each key / value head for its g query heads (kept, g times the size)
  and the probabilities are kept in fp32 and in bf16. ``lean_eager_attention`` multiplies each kv head with
  its g query heads in one product, keeps the fp32 probabilities only, and recomputes their bf16 cast.

Measured on that micro-batch: 1,902 -> 1,331 MB kept (docs/memory.md has the step's peak). Liger-Kernel's fused
RMSNorm and SwiGLU keep the same tensors (in Triton, on GPUs); here they are torch ops, on every device.

Exactness: each forward runs transformers' ops in the same order and dtypes (autocast's casts included), so the
outputs are transformers' (bit for bit in the tests' models). The gradients are the same sums in another order:
the RMSNorm's analytic ``r (g - n mean(g n))`` in fp32; a kv head's gradient summed inside one product rather
than rounded per query head and summed; the q/k/v input gradient rounded once rather than three times. In fp32
they agree with autograd's to fp32 rounding, and under bf16 autocast they are as close to the float64 gradient
as autograd's (tests/unit/models/test_lean_ops.py).

``install_lean_ops`` applies them to the classes whose code is known to be this computation: Llama, Qwen2,
Qwen3 and Mistral's RMSNorm, MLP (with a SiLU) and attention (their sources are identical in transformers,
checked by the tests); any other module keeps its own forward, and so does a LoRA-wrapped projection (the
adapter stays in the graph). The eager attention is chosen where grpolab chooses the eager attention
(``models.inference.attention_for``), under its own registered name (``LEAN_EAGER``); anything it does not
know (dropout, soft-capping, sinks, another class) goes to the model's own eager attention. Modules keep
their class, parameters and state_dict (an instance ``forward``; ``copy.deepcopy`` rebinds it to the copy).
Outside a training forward (no graph recorded) each block runs transformers' computation as it is.
"""

from __future__ import annotations

import functools
import sys
import types

import torch
from torch import nn

RMS_NORMS = frozenset({"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm"})
"""Classes whose forward is ``weight * (x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).to(x.dtype)``."""
SWIGLU_MLPS = frozenset({"LlamaMLP", "Qwen2MLP", "Qwen3MLP", "MistralMLP"})
"""Classes whose forward is ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``."""


class RMSNormFn(torch.autograd.Function):
    """``weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)``, the statistics in fp32, saving ``x`` and the rsqrt."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        h = x.to(torch.float32)
        r = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        normed = (h * r).to(x.dtype)
        ctx.save_for_backward(x, weight, r)
        return weight * normed

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, r = ctx.saved_tensors
        normed = (x.to(torch.float32) * r).to(x.dtype)  # the forward's, recomputed
        grad_w = None
        if ctx.needs_input_grad[1]:
            lead = tuple(range(grad.dim() - 1))
            grad_w = (grad * normed).sum(lead).to(weight.dtype) if lead else (grad * normed).to(weight.dtype)
        grad_x = None
        if ctx.needs_input_grad[0]:
            g = (grad * weight).to(x.dtype).to(torch.float32)  # the gradient reaching the normalised x, as autograd casts it
            n = x.to(torch.float32) * r
            grad_x = (r * (g - n * (g * n).mean(-1, keepdim=True))).to(x.dtype)
        return grad_x, grad_w, None


class SiluMulFn(torch.autograd.Function):
    """``silu(gate) * up``, saving ``gate`` and ``up`` (not ``silu(gate)``)."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return nn.functional.silu(gate) * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up = ctx.saved_tensors
        grad_gate = grad_up = None
        if ctx.needs_input_grad[1]:
            grad_up = grad * nn.functional.silu(gate)
        if ctx.needs_input_grad[0]:
            grad_gate = torch.ops.aten.silu_backward(grad * up, gate)
        return grad_gate, grad_up


def _rms_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    if _records(hidden_states, self.weight):
        return RMSNormFn.apply(hidden_states, self.weight, self.variance_epsilon)
    h = hidden_states.to(torch.float32)  # transformers' forward, op for op (nothing is saved without a graph)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return self.weight * h.to(hidden_states.dtype)


class SwiGLUFn(torch.autograd.Function):
    """``down(silu(gate(x)) * up(x))`` with plain bias-free Linear weights, in the autocast dtype when autocast is on
    (as transformers' Linears run under it), saving the cast ``x`` once (two Linears cast it once each) and
    ``gate(x)``, ``up(x)``, but not the product the down projection reads: the backward recomputes it."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down):
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        xc, wg, wu, wd = (t if dtype is None else t.to(dtype) for t in (x, w_gate, w_up, w_down))
        gate, up = nn.functional.linear(xc, wg), nn.functional.linear(xc, wu)
        ctx.save_for_backward(xc, wg, wu, wd, gate, up)
        ctx.dtypes = (x.dtype, w_gate.dtype, w_up.dtype, w_down.dtype)
        return nn.functional.linear(nn.functional.silu(gate) * up, wd)

    @staticmethod
    def backward(ctx, grad):
        xc, wg, wu, wd, gate, up = ctx.saved_tensors
        x_dtype, g_dtype, u_dtype, d_dtype = ctx.dtypes
        grad = grad.to(wd.dtype)
        silu = nn.functional.silu(gate)
        flat = grad.reshape(-1, grad.shape[-1])
        grad_wd = (flat.t() @ (silu * up).reshape(-1, up.shape[-1])).to(d_dtype)
        grad_h = grad @ wd
        grad_up = grad_h * silu
        grad_gate = torch.ops.aten.silu_backward(grad_h * up, gate)
        xs = xc.reshape(-1, xc.shape[-1])
        grad_wg = (grad_gate.reshape(-1, grad_gate.shape[-1]).t() @ xs).to(g_dtype)
        grad_wu = (grad_up.reshape(-1, grad_up.shape[-1]).t() @ xs).to(u_dtype)
        # each Linear's input gradient reaches x through its own cast: summed in x's dtype, as autograd does
        grad_x = (grad_gate @ wg).to(x_dtype) + (grad_up @ wu).to(x_dtype)
        return grad_x, grad_wg, grad_wu, grad_wd


def _swiglu_forward(self, x: torch.Tensor) -> torch.Tensor:
    projections = (self.gate_proj, self.up_proj, self.down_proj)
    if all(type(p) is nn.Linear and p.bias is None for p in projections) and _records(x, *(p.weight for p in projections)):
        return SwiGLUFn.apply(x, *(p.weight for p in projections))
    gate, up = self.gate_proj(x), self.up_proj(x)
    if _records(gate, up):  # LoRA-wrapped or biased projections: only the product is lean
        return self.down_proj(SiluMulFn.apply(gate, up))
    return self.down_proj(self.act_fn(gate) * up)


def _records(*tensors: torch.Tensor) -> bool:
    """True when autograd records this forward (a training forward): only then is there anything to save."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class _PackedProjections:
    """An attention module's q, k and v projections (plain Linear layers, called in that order on one input) as
    one product in a training forward: ``q_proj`` computes all three outputs and hands k's and v's to the next
    two calls. Under autocast the input is cast to bf16 once, not three times, and kept once for the backward
    (each separate Linear keeps its own cast); the input's gradient is one product, rounded once. Outside a
    training forward, or for another input, each projection is its own Linear."""

    def __init__(self, q: nn.Linear, k: nn.Linear, v: nn.Linear):
        self.layers = (q, k, v)
        self.sizes = [m.out_features for m in self.layers]
        self.handed: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # 1 (k), 2 (v) -> (input, output)

    def install(self) -> None:
        for i, layer in enumerate(self.layers):  # on the layers themselves, so that copy.deepcopy copies the pack too
            layer.lean_pack, layer.lean_index = self, i
            layer.forward = types.MethodType(_packed_forward, layer)

    def first(self, x: torch.Tensor) -> torch.Tensor:
        weight = torch.cat([m.weight for m in self.layers])
        biases = [m.bias for m in self.layers]
        bias = None if all(b is None for b in biases) else torch.cat(
            [b if b is not None else m.weight.new_zeros(m.out_features) for b, m in zip(biases, self.layers, strict=True)]
        )
        q, k, v = nn.functional.linear(x, weight, bias).split(self.sizes, dim=-1)
        self.handed = {1: (x, k), 2: (x, v)}
        return q

    def later(self, index: int, x: torch.Tensor) -> torch.Tensor | None:
        given, out = self.handed.pop(index, (None, None))
        return out if given is x else None


def _packed_forward(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    pack, index = layer.lean_pack, layer.lean_index
    if index == 0:
        pack.handed = {}
        if _records(x, *(m.weight for m in pack.layers)):
            return pack.first(x)
    else:
        out = pack.later(index, x)
        if out is not None:
            return out
    return nn.functional.linear(x, layer.weight, layer.bias)


def _is_silu(act: nn.Module) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"


def install_lean_ops(model: nn.Module) -> int:
    """Give ``model``'s known RMSNorm, SwiGLU and attention blocks the forwards above (before any wrapping: PEFT,
    DDP, FSDP2). Returns how many modules got one."""
    count = 0
    for module in model.modules():
        name = type(module).__name__
        if name in RMS_NORMS and isinstance(getattr(module, "weight", None), torch.Tensor) and hasattr(module, "variance_epsilon"):
            module.forward = types.MethodType(_rms_norm_forward, module)
            count += 1
        elif name in SWIGLU_MLPS and _is_silu(getattr(module, "act_fn", None)) and all(
            hasattr(module, p) for p in ("gate_proj", "up_proj", "down_proj")
        ):
            module.forward = types.MethodType(_swiglu_forward, module)
            count += 1
        elif name in LEAN_ATTENTIONS and all(type(getattr(module, p, None)) is nn.Linear for p in ("q_proj", "k_proj", "v_proj")):
            _PackedProjections(module.q_proj, module.k_proj, module.v_proj).install()
            count += 1
    return count


LEAN_EAGER = "grpolab_eager"
"""The name ``lean_eager_attention`` is registered under in transformers' attention and mask registries."""
LEAN_ATTENTIONS = frozenset({"LlamaAttention", "Qwen2Attention", "Qwen3Attention", "MistralAttention"})
"""Attention classes whose eager attention is transformers' plain one (repeat_kv, scale, mask, fp32 softmax)."""
LEAN_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})
"""config.model_type of the models built from those classes: the eager attention of any other model stays its own."""


class GroupedAttentionFn(torch.autograd.Function):
    """``softmax(q k^T * scaling + mask) v`` for grouped-query attention without repeating k and v, saving the
    products' operands q, k, v and the fp32 probabilities (their cast for the second product is recomputed)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scaling: float):
        out, (qc, kc, vc, p32, scores_dtype) = _grouped_attention(q, k, v, mask, scaling)
        ctx.save_for_backward(qc, kc, vc, p32)
        ctx.scaling, ctx.scores_dtype, ctx.dtypes = scaling, scores_dtype, (q.dtype, k.dtype, v.dtype)
        return out

    @staticmethod
    def backward(ctx, grad):
        qc, kc, vc, p32 = ctx.saved_tensors
        q_dtype, k_dtype, v_dtype = ctx.dtypes
        b, heads, t, d = qc.shape
        kv_heads, s = kc.shape[1], kc.shape[2]
        rows = heads // kv_heads * t
        grad = grad.to(qc.dtype).reshape(b, kv_heads, rows, d)
        p = p32.to(q_dtype).to(qc.dtype).view(b, kv_heads, rows, s)  # the second product's operand, recomputed exactly
        grad_v = p.transpose(-1, -2) @ grad  # a kv head's g query heads sum inside the product
        grad_p = (grad @ vc.transpose(-1, -2)).to(q_dtype).to(torch.float32).view(p32.shape)
        grad_scores = torch._softmax_backward_data(grad_p, p32, -1, ctx.scores_dtype)
        grad_scores = grad_scores.to(qc.dtype).mul_(ctx.scaling).view(b, kv_heads, rows, s)
        grad_q = (grad_scores @ kc).view(b, heads, t, d)
        grad_k = grad_scores.transpose(-1, -2) @ qc.reshape(b, kv_heads, rows, d)
        return grad_q.to(q_dtype), grad_k.to(k_dtype), grad_v.to(v_dtype), None, None


def _grouped_attention(q, k, v, mask, scaling: float):
    """(output [b, heads, t, d], what the backward keeps): transformers' eager attention op for op, dtypes included
    (under autocast the products' operands are cast, the mask's addition promotes, the softmax is fp32), except
    that each key / value head serves its g query heads in one product, as ``repeat_kv`` lays them out (query
    head i reads kv head i // g)."""
    b, heads, t, d = q.shape
    kv_heads, s = k.shape[1], k.shape[2]
    g = heads // kv_heads
    device = q.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    qc, kc, vc = (x if dtype is None else x.to(dtype) for x in (q, k, v))
    scores = (qc.reshape(b, kv_heads, g * t, d) @ kc.transpose(-1, -2)).mul_(scaling).view(b, kv_heads, g, t, s)
    if mask is not None:
        scores = scores + mask[:, :, None, :, :s]
    p32 = nn.functional.softmax(scores, dim=-1, dtype=torch.float32)
    p = p32.to(q.dtype).to(vc.dtype)
    out = (p.view(b, kv_heads, g * t, s) @ vc).view(b, heads, t, d)
    return out, (qc, kc, vc, p32, scores.dtype)


def lean_eager_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **kwargs):
    """transformers' eager attention (same arguments and outputs) for ``LEAN_ATTENTIONS``; anything else, or a
    call with dropout or extra terms (soft-capping, sinks), goes to the model's own eager attention."""
    plain = (
        type(module).__name__ in LEAN_ATTENTIONS
        and not (dropout and module.training)
        and kwargs.get("softcap") is None
        and kwargs.get("s_aux") is None
        and (attention_mask is None or attention_mask.is_floating_point())
        and query.shape[1] % key.shape[1] == 0
    )
    if not plain:
        own = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if own is None:
            raise ValueError(f"{type(module).__name__} has no eager attention of its own to run as {LEAN_EAGER}")
        return own(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    if _records(query, key, value):
        out = GroupedAttentionFn.apply(query, key, value, attention_mask, scaling)
    else:
        out = _grouped_attention(query, key, value, attention_mask, scaling)[0]
    return out.transpose(1, 2).contiguous(), None


@functools.cache
def register_lean_eager() -> str:
    """Register ``lean_eager_attention`` (with the eager mask) in transformers' registries, once; returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(LEAN_EAGER, lean_eager_attention)
    AttentionMaskInterface.register(LEAN_EAGER, ALL_MASK_ATTENTION_FUNCTIONS["eager"])
    return LEAN_EAGER
