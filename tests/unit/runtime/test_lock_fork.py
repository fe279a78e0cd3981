"""A process forked while a run directory is held (a reward's worker) does not keep it locked."""

from __future__ import annotations

import os
import signal
import time

from grpolab.runtime.lock import hold_run_dir


def test_a_forked_child_does_not_keep_the_lock(tmp_path):
    with hold_run_dir(tmp_path / "run"):
        pid = os.fork()
        if pid == 0:  # a worker that lives on after the run
            time.sleep(30)
            os._exit(0)
    try:
        with hold_run_dir(tmp_path / "run") as me:  # taken again at once, the child still alive
            assert me["pid"] == os.getpid()
        assert os.waitpid(pid, os.WNOHANG) == (0, 0)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
