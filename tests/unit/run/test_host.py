"""grpolab.run.host: blocks of 1 MiB or more are given back to the system when freed (glibc)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Raise glibc's dynamic mmap threshold with one freed 24 MiB tensor, then free 96 MiB of 2 MiB tensors
# that sit below a small live one (so the heap top cannot be trimmed): prints the RSS they leave behind.
CODE = """
import sys, torch
from grpolab.run.host import return_freed_memory
if sys.argv[1] == "set":
    assert return_freed_memory()
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
big = torch.ones(6 * 2**20); del big
blocks = [torch.ones(2**19) for _ in range(48)]
keep = torch.ones(16)
before = rss_mb()
del blocks
print(before - rss_mb())
"""


def _freed_mb(mode: str, env=None) -> float:
    proc = subprocess.run([sys.executable, "-c", CODE, mode], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return float(proc.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_freed_tensors_leave_the_resident_memory():
    assert _freed_mb("set") > 80  # of the 96 MiB freed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_a_threshold_chosen_in_the_environment_is_kept(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    from grpolab.run.host import return_freed_memory

    assert return_freed_memory() is False
