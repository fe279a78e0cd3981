"""A benchmark child under a memory watchdog: its process tree's resident memory (VmRSS from /proc) is polled,
and the tree is killed the moment one rank passes the limit or the machine's available memory falls below a
floor, so a measurement that does not fit ends as "out of memory" instead of taking the machine down (the
kernel's OOM killer picks its own victim, often not the benchmark, and only once swap and caches are gone).

A rank is the launched process itself (one process) or, under torchrun, each of the launcher's children (its
workers), counted with everything they started. Linux only (/proc); elsewhere the child runs unwatched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Watched:
    """How a watched child ended."""

    returncode: int
    killed: str | None
    """Why the watchdog killed it (one line), or None: it ended by itself."""
    peak_rank_mb: float
    """The most resident memory one rank held at a poll (MB): a lower bound of its true peak."""


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (every thread's), [] once it is gone."""
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children(p)
    return out


def rss_mb(pid: int) -> float:
    """VmRSS of one process in MB (0 once it is gone)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def available_mb() -> float:
    """The machine's MemAvailable in MB (infinite where /proc/meminfo is missing)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return float("inf")


def rank_usage(launcher: int, torchrun: bool) -> list[float]:
    """Resident MB of each rank: the launcher's tree, or under torchrun each worker's."""
    roots = children(launcher) if torchrun else [launcher]
    return [sum(rss_mb(p) for p in tree(r)) for r in roots]


def run_watched(cmd: list[str], *, env: dict, torchrun: bool, limit_mb: float | None, keep_free_mb: float,
                log: Path, poll_s: float = 0.05) -> Watched:  # fmt: skip
    """Run ``cmd`` (its output into ``log``), killing its whole tree when a rank passes ``limit_mb`` (None: no
    per-rank limit) or the machine has less than ``keep_free_mb`` available."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    peak, killed = 0.0, None
    watch = Path("/proc").is_dir()
    while proc.poll() is None:
        if watch:
            usage = rank_usage(proc.pid, torchrun)
            peak = max([peak, *usage])
            free = available_mb()
            if limit_mb is not None and usage and max(usage) > limit_mb:
                killed = f"a rank held {max(usage):,.0f} MB, past the limit of {limit_mb:,.0f} MB"
            elif free < keep_free_mb:
                killed = f"the machine had {free:,.0f} MB available, under the floor of {keep_free_mb:,.0f} MB"
            if killed:
                kill_tree(proc)
                break
        time.sleep(poll_s)
    return Watched(proc.wait(), killed, peak)


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL every process of ``proc``'s tree (workers first; torchrun's may sit in sessions of their own)."""
    for pid in reversed(tree(proc.pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
