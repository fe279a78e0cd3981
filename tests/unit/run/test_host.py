"""grpolab.run.host: inside a training step, blocks of 1 MiB or more go back to the system when freed
(glibc); after it, such blocks come from the heap again (decoding's per-token temporaries)."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

# Raise glibc's dynamic mmap threshold with one freed 24 MiB tensor; then, inside the step, free 96 MiB
# of 2 MiB tensors that sit below a small live one (so the heap top cannot be trimmed) and read the RSS
# given back; and read how many MiB glibc maps for one 2 MiB tensor inside and after the step.
CODE = """
import ctypes, torch
from grpolab.run.host import freed_memory_returned
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
def mapped_for_one_block():
    before = libc.mallinfo2().hblkhd
    block = torch.ones(2**19)
    return (libc.mallinfo2().hblkhd - before) / 2**20
big = torch.ones(6 * 2**20); del big
with freed_memory_returned() as applies:
    blocks = [torch.ones(2**19) for _ in range(48)]
    keep = torch.ones(16)
    before = rss_mb()
    del blocks
    given_back = before - rss_mb()
    inside = mapped_for_one_block()
after = mapped_for_one_block()
print(applies, given_back, inside, after)
"""


def _has_mallinfo2() -> bool:
    try:
        return sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "mallinfo2")
    except OSError:
        return False


@pytest.mark.skipif(not _has_mallinfo2(), reason="glibc >= 2.33 (mallopt, mallinfo2) only")
def test_freed_tensors_leave_the_resident_memory_inside_a_training_step_only():
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    applies, given_back, inside, after = proc.stdout.split()[-4:]
    assert applies == "True"
    assert float(given_back) > 80  # of the 96 MiB freed
    assert float(inside) >= 2  # a 2 MiB tensor has a mapping of its own in the step
    assert float(after) == 0  # and comes from the heap after it


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_a_threshold_chosen_in_the_environment_is_kept(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    from grpolab.run import host

    host._glibc.cache_clear()
    try:
        with host.freed_memory_returned() as applies:
            assert applies is False
    finally:
        host._glibc.cache_clear()
