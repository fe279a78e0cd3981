"""Forward passes without a graph, made fast: low-precision weight copies and the attention kernel choice.

Two measured facts about CPUs with native bf16 (AVX512-BF16 / AMX), torch 2.13 (benchmarks/README.md):

- Autocast re-casts every fp32 weight to bf16 at every op call. A training forward pays that once
  (autocast caches the casts inside one forward), but a sampler pays it at every decoded token: for
  a small batch the casts cost about as much as the matmuls. A copy of the model whose Linear
  weights are stored in bf16 skips them; under autocast it computes exactly what the fp32 model
  computes under autocast (both round each weight to the nearest bf16).
- A bf16 Linear on a CPU (oneDNN) reorders its weight into oneDNN's blocked layout at every call; for the
  few rows of a decode step that reorder costs as much as the product. The sampler's copy holds each
  Linear weight reordered once per ``refresh`` (``torch.ops.mkldnn._reorder_linear_weight``, the layout
  inductor's frozen CPU graphs use), and its Linears multiply with it: the same oneDNN bf16 product, so the
  same numbers (tests/unit/models/test_inference.py), at ~1.5-1.8x the speed for 32 rows. Its output head
  gets a bf16 weight of its own too (untied from the input embedding, which stays fp32): autocast runs the
  head's product in bf16 anyway, but cast the fp32 weight again at every decoded token.
- PyTorch's SDPA kernels are slow in bf16 on these CPUs: ~5x the plain matmul-softmax attention for
  one-token decoding, and ~5x for forward + backward at a few hundred tokens. The plain ("eager")
  attention materialises the [rows, heads, q, kv] scores, so it is used only while those stay small. For Llama,
  Qwen2, Qwen3 and Mistral models it runs as ``grpolab_eager`` (models/lean_ops.py): transformers' eager attention
  with the grouped key / value heads read in place rather than repeated, and, in a training forward, less kept
  for the backward.

The switch is made around each forward. Under gradient checkpointing the backward pass runs each layer's
forward again, after that switch was undone: ``enable_checkpointing`` makes that recomputation run
with the implementation its forward ran with, as torch requires (it checks the saved tensors match).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from grpolab.models.lean_ops import LEAN_EAGER, LEAN_MODEL_TYPES, register_lean_eager

EAGER_SCORES_BUDGET_BYTES = 64 * 2**20
"""Largest fp32 attention-score tensor of one layer for which the plain attention is chosen."""


def _low_precision_memo(model: torch.nn.Module, dtype: torch.dtype) -> dict[int, torch.nn.Parameter]:
    """deepcopy memo: every Linear's parameters except the output head's, as frozen ``dtype`` copies."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_params = {id(p) for p in head.parameters()} if head is not None else set()
    memo: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            for p in module.parameters(recurse=False):
                if id(p) not in head_params and p.is_floating_point():
                    # copy=True: a model already in ``dtype`` (a bf16 checkpoint under bf16 autocast) would share them
                    memo[id(p)] = torch.nn.Parameter(p.detach().to(dtype, copy=True), requires_grad=False)
    return memo


def inference_copy(model: torch.nn.Module, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A frozen copy of ``model`` in eval mode.

    With ``dtype``, each Linear weight and bias (not the output head, which stays at full precision
    for the log-probs) is stored in ``dtype``, and no full-precision duplicate of them is ever made.
    Run such a copy under autocast to that dtype: norms, embeddings and the head stay in fp32.
    """
    memo = _low_precision_memo(model, dtype) if dtype is not None else {}
    frozen = copy.deepcopy(model, memo)
    frozen.eval()
    for p in frozen.parameters():
        p.requires_grad_(False)
    return frozen


@contextlib.contextmanager
def eager_calls(model: torch.nn.Module) -> Iterator[None]:
    """Inside, every module of ``model`` compiled by model.compile runs its plain call: the hf sampler's
    forwards (a decode step's shapes and cache would each be another compiled graph)."""
    stash = [(m, m._compiled_call_impl) for m in model.modules() if m._compiled_call_impl is not None]
    for module, _ in stash:
        module._compiled_call_impl = None
    try:
        yield
    finally:
        for module, compiled in stash:
            module._compiled_call_impl = compiled


class WeightCopy:
    """A low-precision inference copy of a model that holds memory only between refresh and release.

    ``refresh`` casts the source's current weights into it (parameters kept at full precision are
    shared with the source, not copied); ``release`` frees the cast weights again, so a sampler's copy
    does not add to the training step's peak memory.
    """

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype, *, pack: bool | None = None, rows_hint: int = 32):
        """``pack``: multiply with oneDNN's pre-packed weights (None: where ``packs_linear``); ``rows_hint``: the
        rows a Linear's input usually has (a decode step's), for oneDNN's choice of layout; any other count
        computes the same."""
        self.model = inference_copy(model, dtype)  # uncompiled: copy.deepcopy drops a module's compiled call
        copies = dict(self.model.named_parameters())
        self._pairs = [(copies[name], p) for name, p in model.named_parameters()]
        head = _low_precision_head(self.model, dtype)
        if head is not None:  # its own weight (untied from the input embedding, which stays full precision)
            self._pairs.append((head, model.get_output_embeddings().weight))
        self._dtypes = {id(dst): dst.dtype for dst, _ in self._pairs}
        if pack is None:
            pack = packs_linear(next(model.parameters()).device, dtype)
        # packing frees the plain weight, so a head whose weight is the input embedding's (tied) keeps it
        tied = None if head is not None else getattr(self.model, "get_output_embeddings", lambda: None)()
        packable = [
            m for m in self.model.modules()
            if pack and isinstance(m, torch.nn.Linear) and m.weight.dtype == dtype and m is not tied
        ]  # fmt: skip
        groups = _sibling_groups(self.model, packable)
        grouped = {id(m) for group in groups for m in group}
        self._packed = [_PackedGroup(group, rows_hint) for group in groups]
        self._packed += [_PackedLinear(m, rows_hint) for m in packable if id(m) not in grouped]
        self.release()

    @torch.no_grad()
    def refresh(self) -> torch.nn.Module:
        """Point the copy at the source's current weights, cast where the copy is low-precision (and packed,
        where its Linears multiply with oneDNN's layout)."""
        for dst, src in self._pairs:
            dst.data = src.detach().to(self._dtypes[id(dst)])
        for linear in self._packed:
            linear.pack()
        return self.model

    def release(self) -> None:
        for linear in self._packed:
            linear.unpack()
        for dst, _ in self._pairs:
            dst.data = torch.empty(0, dtype=dst.dtype, device=dst.device)


def _low_precision_head(copy: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Parameter | None:
    """The copy's output head given a ``dtype`` weight of its own, which it returns; None where the head keeps
    full precision: one that runs in fp32 outside autocast (model.lm_head_fp32), has a bias, or is no Linear.

    Under autocast the head's GEMM runs in ``dtype`` anyway (and the training step's too, models/chunked_head.py),
    but the fp32 weight is then cast again at every decoded token: for SmolLM2's 49,152 x 576 head, a 113 MB read
    and a 57 MB write per token, more than the head's product itself."""
    head = copy.get_output_embeddings() if hasattr(copy, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear) or head.bias is not None or getattr(head, "fp32", False):
        return None
    if head.weight.dtype == dtype:
        return None
    head.weight = torch.nn.Parameter(torch.empty(0, dtype=dtype, device=head.weight.device), requires_grad=False)
    return head.weight


def packs_linear(device: torch.device, dtype: torch.dtype | None) -> bool:
    """Whether a Linear of ``dtype`` on ``device`` multiplies faster from oneDNN's pre-packed layout: bf16 on a
    CPU whose oneDNN has native bf16 (this torch build's mkldnn ops present)."""
    if device.type != "cpu" or dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    return hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise") and ops._is_mkldnn_bf16_supported()


class _PackedLinear:
    """One Linear of an inference copy, multiplying with its weight in oneDNN's layout while packed.

    It becomes the module's ``forward`` (an instance attribute: only this copy's modules, which nothing else
    holds). Unpacked it is ``nn.Linear.forward``. Packed, the input is cast to the weight's dtype first, as
    autocast casts it, and the bf16 weight is freed: the packed one replaces it until ``unpack``."""

    def __init__(self, module: torch.nn.Linear, rows_hint: int):
        self.module = module
        self.rows_hint = rows_hint
        self.weight: torch.Tensor | None = None
        module.forward = self

    def pack(self) -> None:
        weight = self.module.weight
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.data, self.rows_hint)
        weight.data = torch.empty(0, dtype=weight.dtype, device=weight.device)

    def unpack(self) -> None:
        self.weight = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is None:
            return type(self.module).forward(self.module, x)
        return torch.ops.mkldnn._linear_pointwise(x.to(self.weight.dtype), self.weight, self.module.bias, "none", [], "")


SIBLING_LINEARS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""Names of a module's Linears that read the same input (attention's q/k/v, a gated MLP's gate/up): multiplied
as one product (``_PackedGroup``)."""


def _sibling_groups(model: torch.nn.Module, packable: list[torch.nn.Module]) -> list[list[torch.nn.Linear]]:
    """The ``SIBLING_LINEARS`` of each module of ``model`` whose members are all packable, of one input width,
    and all with or all without a bias."""
    ok = {id(m) for m in packable}
    groups = []
    for module in model.modules():
        for names in SIBLING_LINEARS:
            members = [getattr(module, name, None) for name in names]
            if not all(id(m) in ok for m in members):
                continue
            if len({m.in_features for m in members}) == 1 and len({m.bias is None for m in members}) == 1:
                groups.append(members)
    return groups


class _PackedGroup:
    """Sibling Linears of an inference copy (``SIBLING_LINEARS``), multiplied as one oneDNN product while packed.

    Each member's ``forward`` becomes a ``_GroupMember``. The first member called with an input computes the
    whole group's product for it and keeps it; each sibling then called with the same tensor (identity) takes
    its slice of it, so q, k and v cost one product instead of three. A member called with another input, or
    twice with one, computes afresh: any call order gives each member its own product. (Inference tensors carry
    no version counter, so an input changed in place between two sibling calls would be served stale; the
    modules these names come from read it unchanged.) Unpacked the members are plain ``nn.Linear``s."""

    def __init__(self, members: list[torch.nn.Linear], rows_hint: int):
        self.members = members
        self.rows_hint = rows_hint
        bounds = [0]
        for m in members:
            bounds.append(bounds[-1] + m.out_features)
        self.slices = [slice(a, b) for a, b in zip(bounds, bounds[1:], strict=False)]
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self._kept: tuple[torch.Tensor, torch.Tensor, set[int]] | None = None
        for i, m in enumerate(members):
            m.forward = _GroupMember(self, i)

    def pack(self) -> None:
        weights = [m.weight for m in self.members]
        self.weight = torch.ops.mkldnn._reorder_linear_weight(torch.cat([w.data for w in weights]), self.rows_hint)
        biases = [m.bias for m in self.members]
        self.bias = None if biases[0] is None else torch.cat([b.data for b in biases])
        for w in weights:
            w.data = torch.empty(0, dtype=w.dtype, device=w.device)

    def unpack(self) -> None:
        self.weight, self.bias, self._kept = None, None, None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The group's product: every member's output, side by side on the last axis."""
        return torch.ops.mkldnn._linear_pointwise(x.to(self.weight.dtype), self.weight, self.bias, "none", [], "")

    def member(self, i: int, x: torch.Tensor) -> torch.Tensor:
        kept = self._kept
        if kept is None or kept[0] is not x or i in kept[2]:
            kept = self._kept = (x, self(x), set())
        kept[2].add(i)
        if len(kept[2]) == len(self.members):
            self._kept = None  # every sibling served: hold neither tensor longer
        return kept[1][..., self.slices[i]]


class _GroupMember:
    """A grouped Linear's ``forward``: its slice of the group's product while packed, else ``nn.Linear.forward``."""

    def __init__(self, group: _PackedGroup, index: int):
        self.group = group
        self.index = index

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.group.weight is None:
            module = self.group.members[self.index]
            return type(module).forward(module, x)
        return self.group.member(self.index, x)


def linear_group(*modules: torch.nn.Module):
    """The packed product of ``modules`` side by side (a callable: input -> their outputs concatenated on the last
    axis) where they are exactly one packed ``SIBLING_LINEARS`` group, in that order; else None."""
    group = getattr(getattr(modules[0], "forward", None), "group", None)
    if not isinstance(group, _PackedGroup) or group.weight is None or list(modules) != group.members:
        return None
    return group


def use_eager_attention(
    device: torch.device, dtype: torch.dtype | None, *, rows: int, heads: int, q_len: int, kv_len: int
) -> bool:
    """True where the plain attention beats SDPA: bf16 on a CPU, with one layer's scores under budget."""
    scores = rows * heads * q_len * kv_len * 4
    return device.type == "cpu" and dtype == torch.bfloat16 and scores <= EAGER_SCORES_BUDGET_BYTES


@contextlib.contextmanager
def attention_implementation(model: torch.nn.Module, name: str | None) -> Iterator[None]:
    """Run ``model``'s forward passes with another attention implementation ("eager" or "sdpa"; for a Llama,
    Qwen2, Qwen3 or Mistral model "eager" runs as ``LEAN_EAGER``, models/lean_ops.py).

    transformers looks the implementation up in the config at every forward, so switching it is
    cheap. Only a switch between "sdpa" and eager is made; flash / flex / custom kernels are kept.
    """
    config = getattr(model, "config", None)
    kept = getattr(config, "_attn_implementation", None) not in ("sdpa", "eager", LEAN_EAGER)
    if name == "eager" and getattr(config, "model_type", None) in LEAN_MODEL_TYPES:
        name = register_lean_eager()
    with _implementation(config, None if kept else name):
        yield


def enable_checkpointing(model: torch.nn.Module) -> None:
    """``model.gradient_checkpointing_enable``, non-reentrant, with each layer's recomputation in backward
    run under the attention implementation of its forward (the switch above is undone by then)."""
    config = model.config
    model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": False, "context_fn": functools.partial(_recompute_as_run, config)}
    )


def _recompute_as_run(config) -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """torch.utils.checkpoint's context_fn, called as a layer's forward runs: (nothing around the forward,
    the forward's attention implementation around its recomputation)."""
    return contextlib.nullcontext(), _implementation(config, getattr(config, "_attn_implementation", None))


@contextlib.contextmanager
def _implementation(config, name: str | None) -> Iterator[None]:
    current = getattr(config, "_attn_implementation", None)
    if name is None or name == current:
        yield
        return
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = current


def wants_eager_attention(
    model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None, **shape: int
) -> bool:
    """``use_eager_attention`` for ``model``'s head count; ``shape`` gives rows, q_len and kv_len."""
    heads = getattr(getattr(model, "config", None), "num_attention_heads", None)
    return heads is not None and use_eager_attention(device, dtype, heads=heads, **shape)


def fused_decode_attention(device: torch.device, dtype: torch.dtype | None) -> bool:
    """Whether the sampler's one-token decode attention runs as SDPA (PyTorch's flash kernel) rather than as
    two batched products around a softmax: in bf16 on a CPU with AMX, whose tiles that kernel multiplies with
    (measured on a Xeon with AMX, 32 rows x 8 heads over 80 keys: 219 against 478 us). Without AMX its bf16
    kernel was the slower one (a Zen 4: 1.9 ms a layer against ~0.3, benchmarks/README.md)."""
    if device.type != "cpu" or dtype != torch.bfloat16:
        return False
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(amx is not None and amx())


def attention_for(model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None, **shape: int):
    """``attention_implementation(model, "eager")`` when ``wants_eager_attention``, else a null context."""
    eager = wants_eager_attention(model, device, dtype, **shape)
    return attention_implementation(model, "eager" if eager else None)


def available_cpus() -> int:
    """Cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota if one is set."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cpus


def limit_cpu_threads() -> int:
    """Lower torch's intra-op threads to ``available_cpus()``; returns the count in use.

    torch starts one thread per physical core of the host, also in a container allowed only a few
    of them; more threads than cores makes each wait for descheduled peers at every barrier. A lower
    count set by the user is kept.
    """
    cpus = available_cpus()
    if torch.get_num_threads() > cpus:
        torch.set_num_threads(cpus)
    return torch.get_num_threads()
