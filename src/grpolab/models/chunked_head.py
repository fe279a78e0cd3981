"""Per-token log-probs and entropies from the LM head without the full [n, T, V] logits.

    logprobs[:, t] = log softmax(h_t W^T / temperature)[completion[:, t]]
    entropy[:, t]  = -sum_v softmax(z_t)_v log softmax(z_t)_v,     z_t = h_t W^T / temperature

A real vocabulary makes the logits the largest tensor of a training step (Qwen2.5: V = 151,936; 64
rows of 1,024 tokens in fp32 is ~40 GB, and the softmax for the entropy and the backward add copies).
Here the head computes them ``chunk`` tokens at a time, and ``ChunkedLogprobs`` recomputes each chunk's
logits in its backward, so forward and backward hold one [chunk, V] logits tensor at a time.

Precision: the three GEMMs (logits, and in the backward the hidden and weight gradients) run in the
compute dtype, bf16 under autocast as every other matmul of the model (TRL and verl compute the logits
in bf16 and upcast them); the logits are upcast, and the softmax, log-sum-exp, entropy and the logits'
gradient are fp32. Without autocast (model.autocast: none, fp32 weights) everything is fp32 as before.
On a GPU, or a CPU with AMX, a bf16 GEMM runs many times faster than an fp32 one (12.7x measured on an
Intel Xeon with AMX), and the head is the largest GEMM of a step for a real vocabulary.

The chunk is sized by device (``chunk_tokens``): 64 MiB of fp32 logits on a CPU (cache-sized), 1 GiB
on CUDA, where every chunk re-reads the [V, H] weight and larger GEMMs run nearer the peak.

Design, and why: the computation runs INSIDE the output-embedding module's own forward, so the
model's forward is still called as a whole (the training forward may be a DDP- or FSDP2-wrapped
model: under FSDP2 the head weight is a sharded DTensor outside its module's forward, and under DDP
bypassing the wrapper's forward breaks gradient sync). At load (before any wrapping)
``install_chunked_head`` replaces the output embedding by a ``ChunkedLMHead``, an ``nn.Linear`` that
shares the very same weight (and bias) Parameter: tied embeddings stay tied, state_dict keys and
``save_pretrained`` output are unchanged, and with no request set it is a plain Linear (generation is
unchanged). ``head_request`` sets, for the next forward calls, the target ids and temperature; the
head then returns ``[n, t, 2]`` (log-prob, entropy) in place of the logits, and the model is called
with ``logits_to_keep`` as before. Requests with ``targets=None`` return fp32 logits (the shared-prompt
forward's one prompt position per distinct prompt).

Models that post-process their logits after the head (soft-capping, logit scales: ``_LOGIT_POSTPROCESSING``
in grpolab.training.logprobs) get no chunked head: they take the plain path, which holds the full logits.

The entropy is a diagnostic, and carries a gradient only when the loss uses it (an entropy bonus).

``keep_head_in_fp32`` (model.lm_head_fp32; ScaleRL, arXiv 2510.13786, and TRL's cast_lm_head_to_fp32) stores
the head's weight in fp32 and runs its GEMMs in fp32 outside autocast, for the logits too; a tied input
embedding shares that fp32 weight, so its output is cast back to the model's dtype, as TRL does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

CHUNK_LOGITS_BYTES = 64 * 2**20
"""Size of one chunk's fp32 logits on a CPU; the chunk is this many bytes' worth of tokens (at least 16)."""
CHUNK_LOGITS_BYTES_CUDA = 2**30
"""The same on CUDA: one chunk per ~1,700 tokens of Qwen2.5's vocabulary, so the [V, H] weight is read
once per that many tokens, not once per 110."""


SOFTMAX_ROWS = 32
"""Tokens of a chunk whose log-sum-exp and entropy are computed together: their temporaries are this many rows of
[V] (6 MB at SmolLM2's 49,152 in fp32), not the chunk's 64 MiB."""
WEIGHT_GRAD_ROWS = 8192
"""Vocabulary rows of the head's weight gradient computed per product in the compute dtype before being added
into the fp32 gradient: the product's result is a transient of this many rows (9 MB at H = 576 in bf16), not of
the whole [V, H] (56 MB for SmolLM2, 272 MB for Qwen2.5-0.5B)."""


def chunk_tokens(vocab_size: int, device_type: str = "cpu") -> int:
    """Tokens per chunk for a vocabulary of ``vocab_size`` on ``device_type``: about CHUNK_LOGITS_BYTES
    (CHUNK_LOGITS_BYTES_CUDA on CUDA) of fp32 logits."""
    budget = CHUNK_LOGITS_BYTES_CUDA if device_type == "cuda" else CHUNK_LOGITS_BYTES
    return max(16, budget // (4 * vocab_size))


def compute_dtype(device_type: str) -> torch.dtype | None:
    """The GEMM dtype autocast gives the head here (bf16 / fp16), or None outside autocast (fp32)."""
    if not torch.is_autocast_enabled(device_type):
        return None
    dtype = torch.get_autocast_dtype(device_type)
    return dtype if dtype in (torch.bfloat16, torch.float16) else None


@dataclass
class HeadRequest:
    """What the next forward of a ChunkedLMHead computes instead of the logits."""

    targets: torch.Tensor | None
    """[n, t] token ids whose log-probs are wanted (aligned with the t kept positions); None = fp32 logits."""
    temperature: float = 1.0
    chunk: int | None = None
    """Tokens per chunk; None = ``chunk_tokens(V)``."""
    into_grad: bool = False
    """Add the weight's gradient straight into ``weight.grad`` where one exists (see ChunkedLogprobs): only
    for a training step that calls ``backward()``, on a model no DDP / FSDP2 wrapper watches."""
    entropy: bool = True
    """Compute the entropies; False (the caller discards them: a reference forward) returns zeros in their
    place and skips a pass over every chunk's logits."""


class ChunkedLMHead(nn.Linear):
    """The output embedding, computing log-probs and entropies chunk by chunk when a request is set."""

    request: HeadRequest | None = None
    fp32: bool = False
    """Every GEMM of the head in fp32, outside autocast (``keep_head_in_fp32``)."""

    @classmethod
    def sharing(cls, head: nn.Linear) -> ChunkedLMHead:
        """A ChunkedLMHead holding ``head``'s own weight and bias Parameters (no copy)."""
        new = cls(head.in_features, head.out_features, bias=head.bias is not None, device="meta")
        new.weight = head.weight
        new.bias = head.bias
        return new

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        request = self.request
        if request is None and not self.fp32:
            return super().forward(hidden)
        # read before autocast is switched off below; None (fp32) for an fp32 head
        gemm_dtype = None if self.fp32 else compute_dtype(hidden.device.type)
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            if request is None or request.targets is None:
                bias = None if self.bias is None else self.bias.float()
                return nn.functional.linear(hidden.float(), self.weight.float(), bias)
            n, t = request.targets.shape
            hidden = hidden[:, -t:] if t else hidden[:, :0]
            chunk = request.chunk or chunk_tokens(self.out_features, hidden.device.type)
            logprobs, entropy = ChunkedLogprobs.apply(
                hidden.reshape(n * t, hidden.shape[-1]),  # t may be 0: a sequence-parallel rank holding no kept position
                self.weight,
                self.bias,
                request.targets.reshape(-1),
                float(request.temperature),
                chunk,
                request.into_grad and torch.is_grad_enabled(),
                gemm_dtype,
                request.entropy,
            )
        return torch.stack([logprobs, entropy], dim=-1).view(n, t, 2)


def _wide(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` in fp32 (or wider: float64 stays float64, for gradcheck)."""
    return None if t is None else t.to(torch.promote_types(t.dtype, torch.float32))


def _operands(weight, bias, gemm: torch.dtype | None):
    """The head's weight and bias as the GEMMs take them: in the compute dtype (a cast only where the
    weight is stored wider), or widened to fp32 without one."""
    if gemm is None:
        return _wide(weight), _wide(bias)
    return weight.to(gemm), None if bias is None else bias.to(gemm)


class _ChunkBuffers:
    """One call's [chunk, V] buffers on a CPU, reused by each of its chunks: the GEMM's result in its dtype, and
    its fp32 copy where the GEMM is narrower. Fresh ones would be allocated per chunk, and a CPU allocator hands
    buffers this large (64 MiB at SmolLM2's vocabulary) back to the kernel when they are freed, so every chunk
    faults its pages in again and the kernel zeroes them (on SmolLM2's shape an update spent ~30% of its time in
    the kernel, docs/speed.md). CUDA's caching allocator reuses its blocks itself: no buffers there (None)."""

    def __init__(self, rows: int, w: torch.Tensor):
        self.gemm = w.new_empty(rows, w.shape[0])
        self.wide = None if _is_wide(w.dtype) else self.gemm.new_empty(self.gemm.shape, dtype=torch.float32)

    @staticmethod
    def of(rows: int, w: torch.Tensor) -> _ChunkBuffers | None:
        return _ChunkBuffers(rows, w) if w.device.type == "cpu" and rows > 0 else None


def _is_wide(dtype: torch.dtype) -> bool:
    return dtype in (torch.float32, torch.float64)


def _chunk_logits(
    h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, temperature: float, buffers: _ChunkBuffers | None = None
):
    """fp32 (or wider) logits of one chunk; the GEMM runs in ``w``'s dtype (into ``buffers`` where given)."""
    if buffers is None:
        logits = nn.functional.linear(h.to(w.dtype), w, b)
        logits = logits if _is_wide(logits.dtype) else logits.float()
    else:
        out = buffers.gemm[: h.shape[0]]
        if b is None:
            torch.mm(h.to(w.dtype), w.t(), out=out)
        else:
            torch.addmm(b, h.to(w.dtype), w.t(), out=out)
        logits = out if buffers.wide is None else buffers.wide[: h.shape[0]].copy_(out)
    return logits.div_(temperature) if temperature != 1.0 else logits


class ChunkedLogprobs(torch.autograd.Function):
    """(logprobs [M], entropy [M]) of targets [M] under softmax(hidden [M, H] W^T / T), chunk by chunk.

    The backward recomputes each chunk's logits: d logprob / d z = onehot(target) - softmax(z), and, when
    the entropy is used in the loss (an entropy bonus), d H / d z = -softmax(z) * (z - E_softmax[z]),
    with E[z] = logz - H. Each chunk's gradient is computed in place in its logits (one [chunk, V]
    buffer; two with the entropy's gradient).

    With ``into_grad`` (a training step whose gradients are consumed by ``backward()``, on a model that
    no DDP / FSDP2 wrapper watches) the weight's gradient is added straight into ``weight.grad`` where
    one exists (every micro-batch after the first), and none is returned to autograd: the [V, H] fp32
    buffer it would need (600 MB for Qwen2.5's vocabulary) is not allocated while the micro-batch's
    activations are alive. Megatron-LM's gradient_accumulation_fusion does the same for its linear layers.
    """

    @staticmethod
    def forward(
        ctx, hidden, weight, bias, targets, temperature: float, chunk: int, into_grad: bool = False, gemm=None,
        with_entropy: bool = True,
    ):  # fmt: skip
        w32, b32 = _operands(weight, bias, gemm)
        logprobs = hidden.new_empty(targets.shape, dtype=_wide(w32).dtype)
        entropy = torch.empty_like(logprobs) if with_entropy else torch.zeros_like(logprobs)
        logz = torch.empty_like(logprobs)
        buffers = _ChunkBuffers.of(min(chunk, targets.numel()), w32)
        for s in range(0, targets.numel(), chunk):
            z = _chunk_logits(hidden[s : s + chunk], w32, b32, temperature, buffers)
            # the softmax statistics a few rows at a time: logsumexp and exp each make a temporary of their
            # input's size, which for the whole chunk would double its memory (each row's numbers are the same)
            end = min(s + chunk, targets.numel())
            for r in range(s, end, SOFTMAX_ROWS):
                rows = slice(r, min(r + SOFTMAX_ROWS, end))
                zr = z[r - s : rows.stop - s]
                lz = torch.logsumexp(zr, dim=-1)
                logz[rows] = lz
                logprobs[rows] = zr.gather(-1, targets[rows, None]).squeeze(-1) - lz
                if not with_entropy:
                    continue
                logp = zr.sub_(lz[:, None])  # in place: z is not needed again
                # H = -sum p log p on the log-probs: lz - sum p z subtracts two large numbers (8.5e-5 nats off
                # in fp32 at logit std 10, against 2e-6 this way)
                entropy[rows] = -torch.linalg.vecdot(logp.exp(), logp)
        ctx.save_for_backward(hidden, weight, bias, targets, logz, entropy)
        ctx.temperature, ctx.chunk, ctx.gemm, ctx.with_entropy = temperature, chunk, gemm, with_entropy
        ctx.param = weight if into_grad else None
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, bias, targets, logz, entropy = ctx.saved_tensors
        w32, b32 = _operands(weight, bias, ctx.gemm)  # w32: the GEMM operand (bf16 under autocast)
        acc = _wide(weight).dtype if ctx.gemm is None else torch.promote_types(weight.dtype, torch.float32)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        with_entropy = grad_entropy is not None and bool(grad_entropy.any())
        if with_entropy and not ctx.with_entropy:
            raise RuntimeError("a gradient reached the entropies of a head request that did not compute them")
        grad_h = torch.empty_like(hidden) if need_h else None
        into = _accumulating_grad(ctx.param, acc) if need_w else None
        grad_w = into if into is not None else torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
        buffers = _ChunkBuffers.of(min(ctx.chunk, targets.numel()), w32)
        for s in range(0, targets.numel(), ctx.chunk):
            c = slice(s, s + ctx.chunk)
            h = hidden[c]
            z = _chunk_logits(h, w32, b32, ctx.temperature, buffers)
            g = grad_logprobs[c, None].to(z.dtype)
            if with_entropy:  # dz = onehot * g - p * (g + (z - E[z]) * g_H)
                p = torch.sub(z, logz[c, None]).exp_()
                dz = z.sub_((logz[c] - entropy[c])[:, None]).mul_(grad_entropy[c, None].to(z.dtype)).add_(g)
                dz.mul_(p).neg_()
                del p
            else:  # dz = onehot * g - p * g
                dz = z.sub_(logz[c, None]).exp_().mul_(-g)
            dz.scatter_add_(-1, targets[c, None], g)
            if ctx.temperature != 1.0:
                dz.div_(ctx.temperature)
            # the GEMMs' operand, cast once (no copy in fp32), into the GEMM's buffer (its logits are spent)
            dzc = dz.to(w32.dtype) if buffers is None or buffers.wide is None else buffers.gemm[: dz.shape[0]].copy_(dz)
            if need_h:
                grad_h[c] = (dzc @ w32).to(hidden.dtype)
            if need_w and ctx.gemm is None:
                grad_w.addmm_(dz.t(), h.to(dz.dtype))
            elif need_w:  # the GEMM in the compute dtype (fp32 accumulation inside it), summed over chunks in fp32
                hc = h.to(ctx.gemm)
                for v in range(0, dzc.shape[1], WEIGHT_GRAD_ROWS):  # a [rows, H] product at a time, not a [V, H] one
                    grad_w[v : v + WEIGHT_GRAD_ROWS].add_(dzc[:, v : v + WEIGHT_GRAD_ROWS].t() @ hc)
            del dzc
            if need_b:
                grad_b += dz.sum(0)
        if into is not None:
            grad_w = None  # already in weight.grad
        elif grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
        grad_b = None if grad_b is None else grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None, None, None


def _accumulating_grad(param: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """``param.grad`` when the head's weight gradient can be added into it in place: a plain dense tensor
    of the computation's dtype (an fp32 weight; a bf16 one's gradient is rounded as autograd would)."""
    grad = None if param is None else param.grad
    if grad is None or type(grad) is not torch.Tensor or grad.layout != torch.strided or grad.dtype != dtype:
        return None
    return grad if grad.shape == param.shape else None


def output_head(model: nn.Module) -> nn.Module | None:
    """The output embedding of a transformers (or PEFT-wrapped) causal LM, or None."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    get = getattr(inner, "get_output_embeddings", None)
    return get() if callable(get) else None


def install_chunked_head(model: nn.Module) -> bool:
    """Make ``model``'s output embedding a ChunkedLMHead sharing its Parameters; True when it is one.

    Call before wrapping the model (PEFT, DDP, FSDP2). Models whose head is not a plain nn.Linear
    (or that have none) are left alone and return False.
    """
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = output_head(inner)
    if isinstance(head, ChunkedLMHead):
        return True
    if type(head) is not nn.Linear or not hasattr(inner, "set_output_embeddings"):
        return False
    inner.set_output_embeddings(ChunkedLMHead.sharing(head))
    return True


def keep_head_in_fp32(model: nn.Module) -> None:
    """Store ``model``'s output head (a ChunkedLMHead: ``install_chunked_head`` first, before any wrapping) in
    fp32 and compute it in fp32; an input embedding tied to it returns the dtype it had (ValueError without
    such a head, e.g. a LoRA on the head: TRL refuses that too)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = output_head(inner)
    if not isinstance(head, ChunkedLMHead):
        raise ValueError(f"the output head is a {type(head).__name__}, not a plain Linear: it cannot be kept in fp32")
    was = head.weight.dtype
    head.float()  # the same Parameter objects, converted: a tied input embedding shares the fp32 weight
    head.fp32 = True
    embed = inner.get_input_embeddings()
    if embed is not None and embed.weight is head.weight and was != torch.float32:
        embed.register_forward_hook(lambda module, args, out: out.to(was))


@contextlib.contextmanager
def head_request(head: ChunkedLMHead, request: HeadRequest) -> Iterator[None]:
    """Forward calls inside this block compute ``request`` instead of the logits."""
    previous, head.request = head.request, request
    try:
        yield
    finally:
        head.request = previous
