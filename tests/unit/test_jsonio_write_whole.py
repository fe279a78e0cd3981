"""Reports, eval.json and plots are written whole: a crash or a SIGKILL mid-write leaves the previous file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpolab import jsonio
from grpolab.eval.results import ModelEval, load_evals, save_evals

SRC = str(Path(__file__).parents[2] / "src")


def test_a_crash_mid_write_keeps_the_previous_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "report.md"
    jsonio.write_whole(path, "old report\n")

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jsonio.os, "replace", crash)
    with pytest.raises(OSError, match="No space left"):
        jsonio.write_whole(path, "new report\n")
    assert path.read_text() == "old report\n" and sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]


def test_sigkill_mid_write_keeps_the_previous_eval_json(tmp_path):
    path = tmp_path / "eval.json"
    save_evals([ModelEval("a", "p", 1, 1, 1.0, {1: 0.25}, {1: 0.25})], path)
    child = (
        "import os, time, sys\nfrom grpolab import jsonio\nfrom grpolab.eval.results import ModelEval, save_evals\n"
        "real = os.replace\n"
        "def slow(a, b):\n    print('written', flush=True)\n    time.sleep(30)\n    real(a, b)\n"
        "jsonio.os.replace = slow\n"
        f"save_evals([ModelEval('b', 'p', 1, 1, 1.0, {{1: 0.75}}, {{1: 0.75}})], {str(path)!r})\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": SRC})  # fmt: skip
    assert proc.stdout.readline().strip() == "written"  # the new file is on disk, not yet in place
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    time.sleep(0.05)
    [kept] = load_evals(path)
    assert kept.label == "a" and kept.pass_at[1] == pytest.approx(0.25)
