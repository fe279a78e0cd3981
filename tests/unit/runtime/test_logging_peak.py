"""runtime/logging.py peak_rss_mb: a process's own peak, not its parent's carried across fork and exec."""

from __future__ import annotations

import subprocess
import sys

import pytest

from grpolab.runtime.logging import peak_rss_mb

CHILD = "from grpolab.runtime.logging import peak_rss_mb; print(peak_rss_mb())"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's; ru_maxrss elsewhere")
def test_a_child_of_a_big_parent_reports_its_own_peak():
    held = bytearray(1500 * 2**20)  # 1.5 GB touched (zeroed) in this process
    assert peak_rss_mb() > 1500
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    # ru_maxrss would read at least 1,500 here (Linux carries it across fork and exec); the child imports torch
    # and grpolab, a few hundred MB at most
    assert float(child.stdout) < 1000, child.stdout
    del held


def test_read_metrics_leaves_out_a_row_still_being_written(tmp_path):
    from grpolab.runtime.logging import read_metrics

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "reward": 0.1')
    assert read_metrics(tmp_path) == [{"step": 1, "reward": 0.5}]
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "reward": 0.1}\n')
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    assert read_metrics(tmp_path / "none") == []
