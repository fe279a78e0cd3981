"""Run folders left behind by a killed trainer are swept: those whose owner and harness are gone, not a live
run's, not one being made."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from grpolab.sandbox import folders as sf
from grpolab.sandbox.harness import remove_folder
from grpolab.sandbox.runner import SandboxLimits, run_python


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_folders_whose_owner_and_harness_are_gone_are_swept(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(sf.tempfile, "tempdir", None)  # re-read TMPDIR
    dead, live = _dead_pid(), os.getpid()
    folders = {name: tmp_path / f"{sf.PREFIX}{name}" for name in ("dead", "live_owner", "live_harness", "new", "old")}
    for folder in folders.values():
        (folder / "work").mkdir(parents=True)
    (folders["dead"] / sf.OWNER).write_text(str(dead))
    (folders["dead"] / sf.HARNESS_PID).write_text(str(dead))
    (folders["live_owner"] / sf.OWNER).write_text(str(live))
    (folders["live_harness"] / sf.OWNER).write_text(str(dead))
    (folders["live_harness"] / sf.HARNESS_PID).write_text(str(live))
    old = time.time() - 2 * sf._GRACE_S
    os.utime(folders["old"], (old, old))  # no owner file, long ago: its trainer died while making it
    (tmp_path / "unrelated").mkdir()
    assert sf.sweep_once.__wrapped__(remove_folder) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{sf.PREFIX}live_owner", f"{sf.PREFIX}live_harness", f"{sf.PREFIX}new", "unrelated"]
    )


def test_a_run_leaves_no_folder_and_records_its_owner_while_it_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(sf.tempfile, "tempdir", None)
    seen = []
    real = sf.record_harness

    def spy(root, pid):
        seen.append((root.parent, (root / sf.OWNER).read_text(), pid))
        real(root, pid)

    monkeypatch.setattr("grpolab.sandbox.runner.record_harness", spy)
    result = run_python("while True: pass", mode="program", limits=SandboxLimits(timeout_s=0.3))
    assert not result.clean_exit
    assert seen and seen[0][0] == tmp_path and seen[0][1] == str(os.getpid())
    assert list(tmp_path.iterdir()) == []


def test_a_harness_that_already_removed_its_folder_is_not_an_error(tmp_path, monkeypatch):
    """Code that ends at once: its harness can remove the run's folder before the trainer records its pid."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(sf.tempfile, "tempdir", None)
    root = sf.new_run_folder()
    remove_folder(root)
    sf.record_harness(root, os.getpid())
    assert not root.exists()
    live = sf.new_run_folder()
    sf.record_harness(live, 123)
    assert (live / sf.HARNESS_PID).read_text() == "123"
