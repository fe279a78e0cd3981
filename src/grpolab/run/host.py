"""Process-wide host settings: a training step's freed memory goes back to the system.

glibc's malloc serves blocks under its mmap threshold from its heap and, each time a larger mapped
block is freed, raises that threshold to the freed size (up to 32 MiB). Freed heap memory mostly stays
resident. A training step is the worst case for this: a micro-batch's activations (CPU tensors of a
few MiB each) are freed during its backward, and the gradients, the tied embedding's dense gradient and
the optimizer's states are allocated after them in fresh mappings, so the freed activations are still
counted in the process's memory under them. Inside ``freed_memory_returned`` every block of
``OWN_MAPPING_BYTES`` or more has a mapping of its own, unmapped when freed. Measured on
benchmarks/memory.py's step at 1,024 tokens: peak RSS 3,338 MiB without, 2,932 MiB with.

Decoding is the opposite case: each token allocates logits-sized temporaries (rows x vocabulary), and
mapping and unmapping them every token cost ~4% of the sampler's speed at Qwen2.5's vocabulary
(README, "Memory"). So the setting holds during training steps only; on leaving, the threshold goes to
32 MiB, where glibc's own dynamic threshold settles in a torch process, and those temporaries come from
the heap again (with the trim threshold at 64 MiB, as glibc pairs them).

The setting is glibc's ``mallopt(M_MMAP_THRESHOLD, ...)``; a threshold the user chose with the
``MALLOC_MMAP_THRESHOLD_`` environment variable is kept, and other C libraries are left alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
from collections.abc import Iterator

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
"""glibc <malloc.h>: the mallopt parameters for the heap-top trim threshold and the mmap threshold."""
OWN_MAPPING_BYTES = 1 << 20
SETTLED_BYTES = 32 << 20
"""glibc's ceiling for its dynamic threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)."""


def _set_thresholds(libc: ctypes.CDLL, mmap_bytes: int) -> None:
    """Both thresholds as glibc's dynamic rule pairs them (trim = 2 x mmap): a fixed mmap threshold
    alone leaves the trim threshold at 128 KiB, and the heap top is then given back and faulted in
    again at every decoded token (measured: ~5% of the sampler's speed)."""
    libc.mallopt(M_MMAP_THRESHOLD, int(mmap_bytes))
    libc.mallopt(M_TRIM_THRESHOLD, 2 * int(mmap_bytes))


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The process's glibc, or None (not Linux, another C library, or MALLOC_MMAP_THRESHOLD_ set)."""
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "malloc_trim") else None


@contextlib.contextmanager
def freed_memory_returned(threshold: int = OWN_MAPPING_BYTES) -> Iterator[bool]:
    """Inside the block, glibc maps blocks of ``threshold`` bytes or more on their own (unmapped when
    freed); free heap memory is handed back on entry. Yields whether the setting applies (see _glibc)."""
    libc = _glibc()
    if libc is None:
        yield False
        return
    libc.malloc_trim(0)
    _set_thresholds(libc, threshold)
    try:
        yield True
    finally:
        _set_thresholds(libc, SETTLED_BYTES)
