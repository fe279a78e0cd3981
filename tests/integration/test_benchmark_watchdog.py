"""benchmarks/watchdog.py, which keeps every long_context.py measurement from taking the machine down: a child
whose memory keeps growing is killed once one rank passes the limit (a rank: the child itself, or under
torchrun each of the launcher's children with everything below it); one that stays under it ends by itself."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from watchdog import run_watched  # noqa: E402

GROW = (
    "import time\nheld = []\nfor _ in range(64):  # up to 1 GiB, then it ends by itself\n"
    "    held.append(bytearray(16 * 2**20))\n    time.sleep(0.01)\n"
)
"""A child that touches 16 MiB more every 10 ms (a bytearray is zero-filled: its pages are resident)."""


def _launch(code: str, nested: bool) -> list[str]:
    if not nested:
        return [sys.executable, "-c", code]
    return [sys.executable, "-c", f"import subprocess, sys; sys.exit(subprocess.run([sys.executable, '-c', {code!r}]).returncode)"]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
@pytest.mark.parametrize("nested", [False, True], ids=["one process", "torchrun-like launcher"])
def test_a_rank_past_the_limit_is_killed_and_one_under_it_ends_by_itself(tmp_path, nested):
    got = run_watched(_launch(GROW, nested), env={}, torchrun=nested, limit_mb=200, keep_free_mb=0, log=tmp_path / "log")
    assert got.killed is not None and "past the limit of 200 MB" in got.killed, got
    assert got.returncode != 0 and got.peak_rank_mb > 200
    small = run_watched(_launch("x = bytearray(2**20)", nested), env={}, torchrun=nested, limit_mb=200, keep_free_mb=0,
                        log=tmp_path / "log")  # fmt: skip
    assert (small.killed, small.returncode) == (None, 0) and small.peak_rank_mb < 200
