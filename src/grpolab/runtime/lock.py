"""One writer per run directory: an fcntl lock on ``<run_dir>/.lock`` held while a run writes there.

Two runs on one run dir would interleave metrics rows, overwrite config.yaml and prune each other's
checkpoints. ``hold_run_dir(run_dir)`` takes an exclusive, non-blocking ``flock`` and writes the
holder (pid, host, command, start time) into the file; a second run fails at once with a RunDirLocked
naming that holder. The kernel drops a flock when its process dies (even by SIGKILL), so a lock file
left by a dead run is simply taken over (its old holder is logged). A run that leaves the block (done, or
stopped by an error or a signal it handled) empties the file first, so only a run killed outright leaves
a holder for the next one to report. ``flock`` is advisory and local:
on NFS each host sees only its own locks.

In a distributed job only the process that writes the run directory takes it (rank 0):
``hold_run_dir_for_job`` takes it there and tells every rank the outcome, so that a refused lock stops
each rank with its own one-line error.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from grpolab.distributed import dist
from grpolab.errors import ConfigError, GrpolabError, one_line

log = logging.getLogger(__name__)

LOCK_NAME = ".lock"

_HELD: set[int] = set()
"""The lock descriptors this process holds now. A forked child (a reward's worker process) shares their
open file description, and with it the flock: it closes its copies at once (``_close_in_child``), so a
worker that outlives its run, or survives its trainer for a moment, never keeps the run directory locked."""


def _close_in_child() -> None:
    for fd in list(_HELD):
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


class RunDirLocked(GrpolabError, RuntimeError):
    """Another live process holds the run directory; the message names it."""


def _holder() -> dict:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": " ".join([os.path.basename(sys.argv[0]) or "python", *sys.argv[1:]])[:500],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _read_holder(fd: int) -> dict:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = json.loads(os.read(fd, 65536).decode("utf-8", "replace") or "{}")
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _open_lock(run_dir: Path) -> int:
    """Create the run dir and open its lock file; an unwritable output folder is a ConfigError."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        return os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise ConfigError(
            f"log.output_dir: cannot write the run directory {run_dir} ({err.strerror}); choose a writable "
            "log.output_dir or fix its permissions"
        ) from err


@contextlib.contextmanager
def hold_run_dir(run_dir: Path | str, *, setting: str = "log.run_name") -> Iterator[dict]:
    """Hold ``run_dir`` exclusively for the block; yields the holder record written into the lock file.
    ``setting``: the config key that chooses another folder, named in the refusal."""
    run_dir = Path(run_dir)
    fd = _open_lock(run_dir)
    _HELD.add(fd)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            h = _read_holder(fd)
            raise RunDirLocked(
                f"{run_dir} is in use by another run (pid {h.get('pid', '?')} on {h.get('host', '?')}, started "
                f"{h.get('started', '?')}: {h.get('command', '?')}). Wait for it to finish or stop it, or choose "
                f"another {setting}"
            ) from err
        old = _read_holder(fd)
        if old.get("pid") not in (None, os.getpid()):
            log.info("taking over the lock of %s left by pid %s on %s (no longer running)", run_dir,
                     old.get("pid"), old.get("host"))
        me = _holder()
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, (json.dumps(me) + "\n").encode())
        try:
            yield me
        finally:
            # Leaving the block (done, or an error Python saw): the holder record goes, so the next run finds
            # an empty lock file. Only a process killed outright (SIGKILL, OOM, power) leaves its record behind.
            os.ftruncate(fd, 0)
    finally:
        _HELD.discard(fd)
        with contextlib.suppress(OSError):  # released even if a copy of the descriptor lives on elsewhere
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextlib.contextmanager
def hold_run_dir_for_job(run_dir: Path | str) -> Iterator[None]:
    """For a job of one or more processes: rank 0 holds ``run_dir``, and every rank learns whether it could.

    A refused lock then stops every rank with its own one-line error, instead of rank 0 alone leaving
    the others to fail in their next collective (a gloo traceback).
    """
    with contextlib.ExitStack() as stack:
        refused: GrpolabError | None = None
        if dist.is_main():
            try:
                stack.enter_context(hold_run_dir(run_dir))
            except GrpolabError as err:
                refused = err
        message = dist.broadcast_object(None if refused is None else one_line(refused))
        if refused is not None:
            raise refused
        if message is not None:
            raise RunDirLocked(f"rank 0 could not take the run directory: {message}")
        yield
