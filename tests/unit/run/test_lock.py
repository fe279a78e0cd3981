"""The run directory's lock: a clean exit leaves nothing to take over; a killed run's record is reported."""

import json
import logging
import os
import signal
import subprocess
import sys

import pytest

from grpolab.runtime.lock import LOCK_NAME, RunDirLocked, hold_run_dir


def _take(run_dir, caplog):
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="grpolab.runtime.lock"), hold_run_dir(run_dir):
        pass
    return caplog.text


def test_a_clean_exit_releases_the_lock_without_a_record(tmp_path, caplog):
    with hold_run_dir(tmp_path) as me:
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == me["pid"]
    assert (tmp_path / LOCK_NAME).read_text() == ""
    assert "taking over" not in _take(tmp_path, caplog)


def test_an_error_inside_the_run_also_releases_it(tmp_path, caplog):
    with pytest.raises(ValueError), hold_run_dir(tmp_path):
        raise ValueError("a reward failed")
    assert (tmp_path / LOCK_NAME).read_text() == ""
    assert "taking over" not in _take(tmp_path, caplog)


def test_a_killed_run_leaves_its_record_and_the_next_start_says_so(tmp_path, caplog):
    code = (
        "import os, signal, sys; from grpolab.runtime.lock import hold_run_dir\n"
        "with hold_run_dir(sys.argv[1]):\n    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, timeout=120)
    assert done.returncode == -signal.SIGKILL
    dead_pid = json.loads((tmp_path / LOCK_NAME).read_text())["pid"]
    assert f"left by pid {dead_pid}" in _take(tmp_path, caplog)


def test_a_refused_second_run_leaves_the_holders_record(tmp_path):
    with hold_run_dir(tmp_path) as me:
        with pytest.raises(RunDirLocked), hold_run_dir(tmp_path):
            pass
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == me["pid"]
