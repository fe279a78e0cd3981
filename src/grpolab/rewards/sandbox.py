"""Run untrusted Python (a model's completion) in a separate, limited process, and survive whatever it does.

Each run is a fresh ``python -I -S`` process (isolated mode: no environment variables read, no user
or site-packages directory, the script's folder not on sys.path; only the standard library can be
imported), started through sandbox_harness.py, which isolates itself before the code runs:

=====================  =========================================================================
limit                  how it is enforced
=====================  =========================================================================
wall time              the parent kills the process group (SIGKILL) after ``timeout_s`` (+0.5 s to start)
CPU time               RLIMIT_CPU = ceil(timeout_s) s (SIGXCPU, then SIGKILL one second later)
memory                 RLIMIT_AS = ``memory_mb`` (allocations beyond it raise MemoryError)
processes              RLIMIT_NPROC = 0 once running as an unprivileged uid: no fork, no threads,
                       so no fork bomb and nothing left behind when the process is killed
files written          RLIMIT_FSIZE = ``file_size_mb`` per file; RLIMIT_NOFILE = 64; no core dumps
output                 the parent reads at most ``max_output_bytes`` of stdout, then kills; stderr is discarded
environment            ``env`` is PATH and LANG only: no secrets of the trainer's environment
working folder         a fresh temporary folder (cwd), deleted afterwards
=====================  =========================================================================

When the trainer runs as root (a container) the harness also, before the code runs:

* moves into new mount and network namespaces (``unshare(CLONE_NEWNS | CLONE_NEWNET)``): the only
  network interface is a loopback that is down, so no connection succeeds, not even to 127.0.0.1;
  every mount is remounted read-only except the working folder (any mount that refuses is named in
  ``isolation``); if the interpreter's standard library is not readable by others (a pyenv Python
  under /root), it is bind-mounted read-only where the code can read it;
* sets no_new_privs and switches to uid/gid 65534 (nobody) with no supplementary groups: the code
  cannot signal the trainer (``os.kill(os.getppid(), 9)`` fails with EPERM), read its
  ``/proc/<pid>/environ``, or delete or write files owned by another user even where a mount stayed
  writable.

Without root the code runs as the trainer's own user, so it could signal the user's processes and
read or write the user's files: only the rlimits above, the clean environment and the network hold.
The network is then cut with an unprivileged user + network namespace where the kernel allows it,
else only by a Python-level guard on the socket module, which code can get around. ``isolation``
says which of these a run got; run training as root in a container for the full set.

Not enforced: a time limit on reading files, or secrecy of the harness's own memory (code written
to game the reward could find the per-run token in asserts mode; the sandbox contains damage, it
does not make the score unforgeable against such code).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from grpolab.rewards.base import RewardError

HARNESS = Path(__file__).with_name("sandbox_harness.py")
NOBODY = 65534
STARTUP_S = 0.5
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
_STATUS_CAP = 1 << 16


class SandboxError(RewardError):
    """The sandbox itself could not be set up (not the code's fault); the message says why."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0
    """Wall-clock limit of one run, killed past it (the CPU limit is the same, rounded up)."""
    memory_mb: int = 512
    """Address-space limit of the process."""
    file_size_mb: int = 16
    """Largest file the code may write (in its working folder)."""
    max_output_bytes: int = 1 << 16
    """stdout read back; more than this kills the run and fails it."""

    def __post_init__(self) -> None:
        if not self.timeout_s > 0 or self.memory_mb < 32 or self.file_size_mb < 0 or self.max_output_bytes < 1:
            raise ValueError(
                f"sandbox limits {self}: need timeout_s > 0, memory_mb >= 32 (Python itself needs ~20 MB), "
                "file_size_mb >= 0 and max_output_bytes >= 1"
            )

    def rlimits(self) -> dict[str, int]:
        mb = 1 << 20
        return {
            "RLIMIT_AS": self.memory_mb * mb,
            "RLIMIT_CPU": max(1, math.ceil(self.timeout_s)),
            "RLIMIT_FSIZE": self.file_size_mb * mb,
            "RLIMIT_NOFILE": 64,
            "RLIMIT_CORE": 0,
            "RLIMIT_NPROC": 0,
        }


@dataclass
class RunResult:
    """What came back from one sandboxed run."""

    returncode: int | None
    stdout: bytes
    passed: set[int] = field(default_factory=set)
    """asserts mode: indices of the tests that ran without raising."""
    timed_out: bool = False
    output_overflow: bool = False
    isolation: str = ""
    """What the harness enforced, e.g. "uid65534+netns+rofs"; empty if it never got ready."""

    @property
    def clean_exit(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.output_overflow


def run_python(
    code: str,
    *,
    mode: Literal["asserts", "program"],
    limits: SandboxLimits,
    tests: Sequence[str] = (),
    stdin: str = "",
) -> RunResult:
    """Run ``code`` in a fresh sandboxed process.

    asserts: the code is executed as module ``solution``, then each of ``tests`` in its namespace;
    ``passed`` holds the tests that did not raise. program: the code runs as ``__main__`` with
    ``stdin`` as its standard input; ``stdout`` is what it printed.
    """
    root = Path(tempfile.mkdtemp(prefix="grpolab-sandbox-")).resolve()
    try:
        nonce = secrets.token_hex(16)
        work, view = root / "work", root / "python"
        work.mkdir()
        view.mkdir()
        job = {
            "mode": mode,
            "code": code,
            "tests": list(tests),
            "nonce": nonce,
            "work": str(work),
            "python_view": str(view),
            "uid": NOBODY,
            "gid": NOBODY,
            "limits": limits.rlimits(),
        }
        (root / "job.json").write_text(json.dumps(job))
        (root / "stdin").write_text(stdin)
        os.chmod(root / "job.json", 0o600)  # read by the harness before it drops its rights
        if os.geteuid() == 0:
            os.chmod(root, 0o711)
            os.chown(work, NOBODY, NOBODY)
        return _launch(root, work, limits, nonce)
    finally:
        _remove(root)


def _launch(root: Path, work: Path, limits: SandboxLimits, nonce: str) -> RunResult:
    status_r, status_w = os.pipe()
    try:
        with open(root / "stdin", "rb") as stdin:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(HARNESS), str(root / "job.json"), str(status_w)],
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                cwd=work,
                env=_ENV,
                pass_fds=(status_w,),
                start_new_session=True,  # its own process group, killed as a whole
            )
    except OSError as err:
        os.close(status_r)
        raise SandboxError(f"could not start the sandbox process ({sys.executable}): {err}") from err
    finally:
        os.close(status_w)
    try:
        out, status, timed_out, overflow = _collect(proc, status_r, limits)
    finally:
        if proc.poll() is None:
            _kill(proc)
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        os.close(status_r)
    return _result(proc.returncode, out, status, timed_out, overflow, nonce)


def _collect(proc: subprocess.Popen, status_fd: int, limits: SandboxLimits):
    """Read stdout and the status pipe until both close, the deadline passes or a cap is exceeded."""
    deadline = time.monotonic() + limits.timeout_s + STARTUP_S
    caps = {"out": limits.max_output_bytes, "status": _STATUS_CAP}
    bufs = {"out": bytearray(), "status": bytearray()}
    timed_out = overflow = False
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, "out")  # type: ignore[arg-type]
        sel.register(status_fd, selectors.EVENT_READ, "status")
        while sel.get_map() and not overflow:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                bufs[key.data] += chunk
                overflow = overflow or len(bufs[key.data]) > caps[key.data]
    if not timed_out and not overflow:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            timed_out = True
    return bytes(bufs["out"]), bufs["status"].decode("utf-8", "replace"), timed_out, overflow


def _result(returncode, out: bytes, status: str, timed_out: bool, overflow: bool, nonce: str) -> RunResult:
    lines = status.splitlines()
    ready = next((i for i, line in enumerate(lines) if line.startswith("ready")), None)
    if ready is None:
        errors = [line[len("error ") :] for line in lines if line.startswith("error ")]
        if errors:
            raise SandboxError(f"the sandbox could not isolate the code: {errors[0]}")
        if not timed_out:
            raise SandboxError(
                f"the sandbox process exited with status {returncode} before running the code "
                f"({sys.executable} -I -S {HARNESS})"
            )
    passed = set()
    for line in lines[(ready or 0) + 1 :]:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "pass" and parts[1] == nonce and parts[2].isdigit():
            passed.add(int(parts[2]))
    isolation = lines[ready].partition(" ")[2] if ready is not None else ""
    return RunResult(returncode, out, passed, timed_out, overflow, isolation)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def _remove(root: Path) -> None:
    """Delete the run's folder, whatever permissions the code left on what it wrote."""

    def fix_and_retry(func, path, _exc) -> None:
        try:
            os.chmod(os.path.dirname(path), 0o700)
            os.chmod(path, 0o700)
            func(path)
        except OSError:
            pass

    shutil.rmtree(root, onerror=fix_and_retry)
