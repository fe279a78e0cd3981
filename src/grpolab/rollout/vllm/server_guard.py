"""A vLLM server that dies with the process that started it, whatever kills that process.

rollout/vllm/server.py does not start the server itself: it starts this file as a script (standard library
only, so it starts in milliseconds and imports nothing of grpolab's), in a new session, with the server's
command line after ``--``. The guard is the leader of the session's process group, starts the server in
that group (the server's engine core joins it too) and waits. It stops the whole group when

* the owner (the trainer, or ``grpolab serve``) dies, even by SIGKILL: on Linux the kernel sends the guard
  SIGTERM at once (``prctl(PR_SET_PDEATHSIG)``), and everywhere the guard sees its parent change
  (``os.getppid()``, polled every ``POLL_S``). The kernel's signal fires when the *thread* that started the
  guard ends, not the process, so the owner asks for it (``--pdeathsig``) only when it starts the guard
  from its main thread; from any other thread the poll alone notices;
* it gets SIGTERM (the owner's ``VLLMServer.stop``, which signals the whole group).

Stopping: SIGTERM to the group, SIGKILL after ``GRACE_S`` to whatever is left, then the shared-memory
files the group's processes mapped (vLLM's message queues, ~400 MB that a killed server never unlinks) and
the paths listed in the owner's record are removed, and the record with them. When the server exits on its
own, the guard exits with its status (a server killed by a signal: the guard ends by the same signal), so
the owner reads the server's status as the guard's.

The record (``--record``, JSON) is the owner's: pid and start time of the owner and of the group, and the
paths to remove. It is what is left when the guard itself was killed outright with its owner; the next
server started on this machine reads it and stops what is left (rollout/vllm/server.py, reclaim_stale).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

SHM_ROOT = Path("/dev/shm")
SHM_PREFIXES = ("psm_", "sem.mp-", "grpolab-")
"""What may be removed under /dev/shm: vLLM's queues and their semaphores, grpolab's weight transfer folders."""
POLL_S = 0.5
GRACE_S = 8.0
"""Seconds between SIGTERM and SIGKILL (the owner's own stop kills the group after 10)."""
PR_SET_PDEATHSIG = 1


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22): a pid with another start
    time is another process. None when no such process runs (or off Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def group_pids(pgid: int) -> list[int]:
    """The live processes (zombies left out) of process group ``pgid``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (proc / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid and fields[0] != "Z":  # fields[2]: the process group
                pids.append(int(proc.name))
    return pids


def mapped_shm(pids: list[int]) -> list[Path]:
    """The /dev/shm files these processes map (vLLM's message queues between its processes)."""
    found = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
                if path.startswith(("/dev/shm/psm_", "/dev/shm/sem.mp-")):  # queues, and their semaphores
                    found.add(Path(path))
    return sorted(found)


def remove_shm(paths: list[str | Path]) -> None:
    """Remove these paths, each only if it lies directly under /dev/shm with a name of SHM_PREFIXES."""
    for raw in paths:
        path = Path(raw)
        if path.parent != SHM_ROOT or not path.name.startswith(SHM_PREFIXES):
            continue  # a record names nothing else; a damaged one deletes nothing
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def read_record(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def stop_group(pgid: int, record: Path | None, grace_s: float = GRACE_S, *, signal_group: bool = True) -> None:
    """SIGTERM to the group, SIGKILL after ``grace_s`` to every other member, then the shared memory and the
    record's paths; the record goes last. The calling process may be in the group (the guard): it is spared."""
    me = os.getpid()
    files = [*mapped_shm(group_pids(pgid)), *(read_record(record).get("paths", []) if record else [])]
    if signal_group:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while [p for p in group_pids(pgid) if p != me] and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in group_pids(pgid):
        if pid != me:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10  # a killed process takes a moment to go (its memory is freed first)
    while [p for p in group_pids(pgid) if p != me] and time.monotonic() < deadline:
        time.sleep(0.1)
    if not [p for p in group_pids(pgid) if p != me]:
        remove_shm(files)
        if record is not None:
            record.unlink(missing_ok=True)


def _set_pdeathsig(signum: int) -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description="start a command (after --); stop its process group when the owner dies")
    p.add_argument("--owner", type=int, required=True, help="the pid that started this guard")
    p.add_argument("--record", type=Path, default=None, help="the owner's record (JSON) of paths to remove")
    p.add_argument("--pdeathsig", action="store_true", help="the owner started it from its main thread")
    a = p.parse_args(argv[:split])
    command = argv[split + 1 :]
    if not command:
        p.error("give the server's command line after --")
    stop = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    if a.pdeathsig:
        _set_pdeathsig(signal.SIGTERM)
    pgid = os.getpgrp()
    if os.getppid() != a.owner:  # the owner died before the kernel could be asked to tell
        stop_group(pgid, a.record)
        return 128 + signal.SIGTERM
    server = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = server.wait(timeout=POLL_S)
            break
        if stop or os.getppid() != a.owner:
            if os.getppid() != a.owner:  # not the owner's own stop
                print(f"grpolab: the process that started this server (pid {a.owner}) is gone; stopping the server",
                      file=sys.stderr, flush=True)  # fmt: skip
            stop_group(pgid, a.record)
            return 128 + signal.SIGTERM
    if code < 0:  # killed by a signal: end the same way, so the owner reads the server's own status
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main())
