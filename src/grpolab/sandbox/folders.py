"""The sandbox's temporary run folders: made with the trainer's pid in them, and swept when left behind.

A run's folder is removed by the trainer when the run ends and by the harness when the code has ended
(grpolab.sandbox.runner). Both can miss it: the trainer killed (SIGKILL, the OOM killer) between making
the folder and starting the harness, or, without namespaces, code that kills every process of its user
(``os.kill(-1, 9)``: the trainer and the harness together). So each folder records its owner (the
trainer's pid) and, once started, the harness's pid, and the first sandbox run of a process removes
every ``grpolab-sandbox-*`` folder whose owner and harness are both gone.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

PREFIX = "grpolab-sandbox-"
OWNER, HARNESS_PID = "owner.pid", "harness.pid"
_GRACE_S = 60.0
"""A folder with no owner file yet is left alone this long (its owner is writing it now)."""


def new_run_folder() -> Path:
    root = Path(tempfile.mkdtemp(prefix=PREFIX)).resolve()
    (root / OWNER).write_text(str(os.getpid()))
    return root


def record_harness(root: Path, pid: int) -> None:
    """Write the harness's pid; a harness that already ran to its end has removed the folder, and so this."""
    with contextlib.suppress(FileNotFoundError):
        (root / HARNESS_PID).write_text(str(pid))


def _alive(pid_file: Path) -> bool | None:
    """Whether the process the file names runs; None when there is no readable file."""
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it runs, as another user
        return True
    return True


def stale(root: Path, now: float) -> bool:
    """Left behind: its owner and its harness are gone (or it has no owner file and is older than the grace)."""
    owner = _alive(root / OWNER)
    if owner or _alive(root / HARNESS_PID):
        return False
    if owner is None:
        try:
            return now - root.stat().st_mtime > _GRACE_S
        except OSError:
            return False
    return True


@functools.cache
def sweep_once(remove: Callable[[Path], None]) -> int:
    """Remove the left-behind run folders, once per process; returns how many."""
    now, removed = time.time(), 0
    try:
        entries = list(Path(tempfile.gettempdir()).glob(PREFIX + "*"))
    except OSError:
        return 0
    for root in entries:
        if root.is_dir() and not root.is_symlink() and stale(root, now):
            remove(root)
            removed += 1
    return removed
