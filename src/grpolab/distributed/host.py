"""A training step's freed memory goes back to the system before its largest allocations (glibc).

glibc's malloc serves blocks under its mmap threshold from its heap and raises that threshold (up to 32
MiB) as larger blocks are freed; freed heap memory stays resident until trimmed. On a CPU a training
step allocates its largest tensors right after freeing many smaller ones: the backward frees the
micro-batch's activations (tensors of a few MiB) layer by layer and ends with the input embedding's
dense [V, H] gradient (600 MB at Qwen2.5's vocabulary); the optimizer step then allocates AdamW's
states. Those big blocks are fresh mappings, so the freed activations were still counted under them
(measured on benchmarks/memory.py at 1,024 tokens: ~0.4 GB of the step's peak). ``malloc_trim(0)``
just before each hands the free heap pages back.

Why trim at these two points rather than lower the mmap threshold for the whole step (tried first):
a low threshold maps and unmaps every elementwise temporary. In benchmarks/vs_trl.py on a Zen 3 (1
thread) the training phase then took 7.80 s per step against 6.79 s without, and the run's system time
went from 9 s to 24 s; with the two trims, 7.01 s and 19 s (the trimmed pages are faulted in again once
by the next micro-batch). The same memory comes back (2,905 MiB at 1,024 tokens against 2,932).

Each trim is paid for (the walk of the heap, then the re-faults), so each runs only where a fresh mapping
follows: before the embedding's gradient when that gradient is at least ``FRESH_MAPPING_BYTES`` (a smaller
one comes from the heap, which reuses the freed pages), and before the optimizer's first step (AdamW's
states; a fused step allocates nothing big after). Measured in benchmarks/vs_trl.py on an AMD EPYC Zen 4 (1
thread, the 33.6M bench model, an 80-token vocabulary): a trim at every micro-batch and every step had made
the training phase 2.84 -> 3.25 s per step against d716c6c, for 105 MB less peak RSS.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import os
import platform
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import torch

from grpolab.distributed.parallel import unwrap

T = TypeVar("T")


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The process's glibc, or None (not Linux, or another C library)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "malloc_trim") else None


TRIM_MIN_FREE_BYTES = 64 << 20
"""Below this much free heap a trim is not worth it: the next micro-batch faults the pages in again."""
FRESH_MAPPING_BYTES = 32 << 20
"""glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX): a block at least this big is always
a fresh mapping, so the free heap under it is counted on top; a smaller one may reuse that heap."""


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
    ]


def _free_heap_bytes(libc: ctypes.CDLL) -> float:
    """Free bytes in glibc's heaps (mallinfo2, glibc >= 2.33; unknown before: infinite)."""
    info = getattr(libc, "mallinfo2", None)
    if info is None:
        return float("inf")
    info.restype = _MallInfo2
    return float(info().fordblks)


_ON_HOST = contextvars.ContextVar("grpolab_step_on_host", default=True)
"""False inside a step whose model lives on an accelerator: its tensors are not glibc's, and a trim
there is only host work (and a walk of the heap) in the loop."""


def give_back_freed_memory(min_free: int = TRIM_MIN_FREE_BYTES) -> bool:
    """Hand glibc's free heap pages back to the system (``malloc_trim(0)``) when at least ``min_free``
    bytes are free; True when it did. Small models free too little for the re-faults to pay. Nothing
    inside a step on CUDA (``giving_back_freed_memory``)."""
    libc = _glibc()
    if libc is None or not _ON_HOST.get() or _free_heap_bytes(libc) < min_free:
        return False
    libc.malloc_trim(0)
    return True


@contextlib.contextmanager
def freed_memory_given_back_before(embeddings: torch.nn.Module | None) -> Iterator[None]:
    """Inside the block, every backward gives the freed heap back just before ``embeddings`` (the model's
    input embeddings) computes its weight's gradient: by then the backward has freed the activations."""
    weight = getattr(embeddings, "weight", None)
    if _glibc() is None or weight is None or weight.numel() * 4 < FRESH_MAPPING_BYTES:  # its fp32 gradient, at most
        yield
        return

    def on_forward(_module, _inputs, output):
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(_give_back_then_pass)

    handle = embeddings.register_forward_hook(on_forward)
    try:
        yield
    finally:
        handle.remove()


def give_back_before_first_step(optimizer: torch.optim.Optimizer) -> bool:
    """``give_back_freed_memory()`` before an optimizer step that allocates its states (the first: AdamW's
    two moments per parameter); later fused steps allocate nothing big, and a trim would only cost re-faults.
    An optimizer without ``state`` (a wrapper) is trimmed before every step, as before."""
    state = getattr(optimizer, "state", None)
    if state is not None and len(state) > 0:
        return False
    return give_back_freed_memory()


def _give_back_then_pass(grad: torch.Tensor) -> None:
    give_back_freed_memory()  # the hook returns None: the gradient passes unchanged


def on_host(model: torch.nn.Module) -> bool:
    """True when ``model``'s parameters are in host memory (a CPU model, or one without parameters)."""
    param = next(model.parameters(), None)
    return param is None or param.device.type == "cpu"


def giving_back_freed_memory(step: Callable[..., T]) -> Callable[..., T]:
    """Decorator for a training step whose first argument is the model (DDP-wrapped or not): inside it,
    freed memory goes back before the input embeddings' gradient; the step calls
    ``give_back_freed_memory()`` itself before its optimizer step."""

    @functools.wraps(step)
    def wrapped(model: torch.nn.Module, *args, **kwargs) -> T:
        inner = unwrap(model)
        if not on_host(inner):  # activations and states live in the device's allocator: no hooks, no trims
            token = _ON_HOST.set(False)
            try:
                return step(model, *args, **kwargs)
            finally:
                _ON_HOST.reset(token)
        get = getattr(inner, "get_input_embeddings", None)
        with freed_memory_given_back_before(get() if callable(get) else None):
            return step(model, *args, **kwargs)

    return wrapped


def describe_cpu() -> str:
    """"Intel(R) Xeon(R) ..., 2 cores, AVX-512 + AVX512-BF16 + AMX": what a figure measured on a CPU must name."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{platform.processor() or 'unknown CPU'}, {len(os.sched_getaffinity(0))} cores"
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    kinds = [name for flag, name in (("avx512f", "AVX-512"), ("avx512_bf16", "AVX512-BF16"), ("amx_bf16", "AMX")) if flag in flags]
    isa = " + ".join(kinds) if kinds else ("AVX2 only" if "avx2" in flags else "no AVX2")
    return f"{fields.get('model name', 'unknown CPU')}, {len(os.sched_getaffinity(0))} cores, {isa}"
