"""Process-wide host settings: freed memory goes back to the system.

glibc's malloc serves blocks under its mmap threshold from its heap and, each time a larger mapped
block is freed, raises that threshold to the freed size (up to 32 MiB). Freed heap memory mostly stays
resident. A training step is the worst case for this: a micro-batch's activations (CPU tensors of a
few MiB each) are freed during its backward, and the gradients, the tied embedding's dense gradient and
the optimizer's states are allocated after them in fresh mappings, so the freed activations are still
counted in the process's memory under them. Fixing the threshold gives every block of
``OWN_MAPPING_BYTES`` or more a mapping of its own, unmapped when freed; small blocks (a decoded
token's tensors) stay on the heap. Measured on benchmarks/memory.py at 1,024 tokens: the step's peak
RSS fell from 3.34 to 2.93 GiB, at the same step time (README, "Memory").

The setting is glibc's ``mallopt(M_MMAP_THRESHOLD, ...)``; a threshold the user chose with the
``MALLOC_MMAP_THRESHOLD_`` environment variable is kept, and other C libraries are left alone.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_MMAP_THRESHOLD = -3
"""glibc <malloc.h>: the mallopt parameter for the mmap threshold."""
OWN_MAPPING_BYTES = 1 << 20


def return_freed_memory(threshold: int = OWN_MAPPING_BYTES) -> bool:
    """Have glibc map blocks of ``threshold`` bytes or more on their own (unmapped when freed); True when set.

    Call once per process, before the model loads (the grpolab command line does). False, and nothing
    changed, off Linux, on a C library other than glibc, or when MALLOC_MMAP_THRESHOLD_ is set.
    """
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # glibc only: musl's mallopt takes no parameters
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, int(threshold)))
