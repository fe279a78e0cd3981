"""Run untrusted Python (a model's completion) in a separate, limited process, and survive whatever it does.

Each run is a fresh ``python -I -S`` process (isolated mode: no environment variables read, no user
or site-packages directory, the script's folder not on sys.path; only the standard library can be
imported), started through harness.py, which isolates the code before it runs. The code
never sees what it is checked against: in asserts mode it gets only the expressions to evaluate (the
calls under test) and sends back their values as plain data, which this process parses with bounds
on size and depth (``read_status``); the caller (grpolab.rewards.code) compares them. Whatever the
code writes ends as values or as nothing, never as an exception here. The run's temporary folder is
removed by this process and by the harness itself, so it goes even when the caller stops waiting.

=====================  =========================================================================
limit                  how it is enforced
=====================  =========================================================================
wall time              the harness kills the code ``timeout_s`` + ``STARTUP_S`` / 2 after it forks it
                       (set-up included); the parent kills the whole process group (SIGKILL) at
                       ``timeout_s`` + ``STARTUP_S`` after the start
CPU time               RLIMIT_CPU = ceil(timeout_s) s (SIGXCPU, then SIGKILL one second later)
memory                 RLIMIT_AS = ``memory_mb`` (allocations beyond it raise MemoryError)
processes              RLIMIT_NPROC = 0 (the code runs as an unprivileged uid): no fork, no threads
files written          RLIMIT_FSIZE = ``file_size_mb`` per file; in total ``disk_mb`` (and 4096
                       files), the size of the tmpfs working folder; RLIMIT_NOFILE = 64; no core dumps
output                 the parent reads at most ``max_output_bytes`` of stdout, then kills; stderr is discarded
environment            ``env`` is PATH and LANG only: no secrets of the trainer's environment
=====================  =========================================================================

Full isolation (``isolation`` reads ``uid65534+pidns+netns+mountns+newroot+tmpfs`` as root,
``userns+pidns+netns+mountns+newroot+tmpfs`` without root):

* a new PID namespace: the code sees no other process (its /proc is its own; ``os.kill(-1, 9)``
  reaches nothing outside), and the namespace's first process, which stays in the parent's process
  group, takes the code down with it when the parent kills the group;
* new network, IPC and UTS namespaces: one loopback interface, down; no connection to anything, not
  even 127.0.0.1, and no abstract unix socket of the host;
* a new mount namespace whose root is a read-only tmpfs holding only the interpreter, its standard
  library (its site-packages masked), the shared libraries they load (found once with ``ldd``),
  /etc/ld.so.cache, /dev/null, zero, random and urandom, a fresh /proc, and ``/work``: a tmpfs of
  ``disk_mb``, the code's working folder and TMPDIR. The host's root is unmounted (pivot_root), so
  no host file, folder or path-based unix socket can be reached;
* as root: uid/gid 65534 (nobody), no supplementary groups, no capabilities; without root: a user
  namespace mapping only the trainer's own uid, every capability dropped. no_new_privs either way.

Without root the isolation is the same where the kernel lets an unprivileged user create user
namespaces (``sysctl user.max_user_namespaces`` > 0; some distributions or container seccomp profiles
forbid it). What it cannot give is a different uid: were the code to escape the namespaces (a kernel
bug), it would hold the trainer's user's rights. Where user namespaces are refused, the fallback
(``isolation`` ``pynet``) has only the rlimits, the clean environment, a host temporary folder as cwd
and a Python-level guard on the socket module, which code can get around: the code can then read and
write what the trainer's user can, see and signal its processes, and a program that leaves its process
group while sleeping outlives its run. The score stays unforgeable in every mode (decided by the
caller); the contents of the machine do not. Run training as root in a container for the full set.

Not enforced: a time limit on reading files (there are few to read).
"""

from __future__ import annotations

import functools
import glob
import json
import math
import os
import re
import selectors
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from grpolab.errors import RewardError
from grpolab.sandbox.folders import new_run_folder, record_harness, sweep_once
from grpolab.sandbox.harness import remove_folder
from grpolab.sandbox.verdict import MAX_DEPTH, RAISED, decode

HARNESS = Path(__file__).with_name("harness.py")
NOBODY = 65534
STARTUP_S = 0.5
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
_STATUS_CAP = 1 << 20
_JSON_MARKS = re.compile(r'[\[\]{}"\\]')
_LDD_PATH = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x")


class SandboxError(RewardError):
    """The sandbox itself could not be set up (not the code's fault); the message says why. During training the
    sample it was running for fails (``sandbox_error``; docs/training.md, "Failed samples"), never scores 0."""

    failure_kind = "sandbox_error"


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
    disk_mb: int = 64
    """Size of the working folder (a tmpfs): all the files the code writes, together."""

    def __post_init__(self) -> None:
        if (
            not self.timeout_s > 0
            or self.memory_mb < 32
            or self.file_size_mb < 0
            or self.max_output_bytes < 1
            or self.disk_mb < 1
        ):
            raise ValueError(
                f"sandbox limits {self}: need timeout_s > 0, memory_mb >= 32 (Python itself needs ~20 MB), "
                "file_size_mb >= 0, max_output_bytes >= 1 and disk_mb >= 1"
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
    values: dict[int, Any] = field(default_factory=dict)
    """asserts mode: expression index -> its plain value (verdict.decode), or verdict.RAISED."""
    timed_out: bool = False
    output_overflow: bool = False
    isolation: str = ""
    """What the harness enforced, e.g. "uid65534+pidns+netns+..."; empty if it never got ready."""
    loaded: bool = False
    """asserts mode: the code ran to its end (or to exit() / sys.exit(0)), as the run reported it."""

    @property
    def clean_exit(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.output_overflow

    @property
    def out_of_time(self) -> bool:
        """Stopped by a time limit: the trainer's deadline, the harness's wall-clock kill (SIGKILL) or
        RLIMIT_CPU (SIGXCPU); the harness reports a killed code as 128 + the signal."""
        return self.timed_out or self.returncode in (128 + 9, 128 + 24)


@functools.cache
def interpreter_files(executable: str = sys.executable) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(host paths the sandbox shows read-only, folders inside them it masks), found once per process.

    The paths are the isolated interpreter's sys.path (its standard library), the interpreter, and
    every shared library that it or a compiled stdlib module loads, as ``ldd`` resolves them.
    """
    probe = "import json, os, sys; print(json.dumps([sys.path, os.path.realpath(sys.executable)]))"
    try:
        done = subprocess.run(
            [executable, "-I", "-S", "-c", probe], capture_output=True, text=True, env=_ENV, timeout=60, check=True
        )
    except (OSError, subprocess.SubprocessError) as err:
        raise SandboxError(f"could not run {executable} to list its standard library: {err}") from err
    path, binary = json.loads(done.stdout)
    stdlib = [p for p in path if os.path.exists(p)]
    objects = [binary] + [f for p in stdlib for f in sorted(glob.glob(os.path.join(p, "*.so")))]
    libraries: set[str] = set()
    try:
        listed = subprocess.run(["ldd", *objects], capture_output=True, text=True, env=_ENV, timeout=60)
        libraries.update(m.group(1) for m in _LDD_PATH.finditer(listed.stdout))
    except (OSError, subprocess.SubprocessError):  # no ldd: show the usual library folders whole
        libraries.update(d for d in ("/lib", "/lib64", "/usr/lib", "/usr/lib64") if os.path.isdir(d))
    extra = [p for p in ("/etc/ld.so.cache",) if os.path.exists(p)]
    paths = tuple(dict.fromkeys([*stdlib, binary, *sorted(libraries), *extra]))
    masks = tuple(os.path.join(p, "site-packages") for p in stdlib if os.path.isdir(os.path.join(p, "site-packages")))
    return paths, masks


def run_python(
    code: str,
    *,
    mode: Literal["asserts", "program"],
    limits: SandboxLimits,
    exprs: Sequence[str] = (),
    stdin: str = "",
) -> RunResult:
    """Run ``code`` in a fresh sandboxed process.

    asserts: the code is executed as module ``solution``, then each of ``exprs`` is evaluated in its
    namespace; ``values`` holds each value that is plain data (RAISED for the others). program:
    the code runs as ``__main__`` with ``stdin`` as its standard input; ``stdout`` is what it printed.
    """
    paths, masks = interpreter_files()
    sweep_once(remove_folder)  # folders a killed trainer left behind (sandbox_folders)
    root = new_run_folder()
    try:
        work = root / "work"  # the fallback's working folder; the namespaces give the code a tmpfs instead
        work.mkdir()
        (root / "root").mkdir()
        job = {
            "mode": mode,
            "code": code,
            "exprs": list(exprs),
            "root": str(root / "root"),
            "host_work": str(work),
            "paths": list(paths),
            "masks": list(masks),
            "uid": NOBODY,
            "gid": NOBODY,
            "limits": {
                "rlimits": limits.rlimits(),
                "wall_s": limits.timeout_s + STARTUP_S / 2,  # from before the set-up, which takes ~0.1 s
                "disk_mb": limits.disk_mb,
                "inodes": 4096,
            },
        }
        (root / "job.json").write_text(json.dumps(job))
        os.chmod(root / "job.json", 0o600)  # read by the harness before it drops its rights
        (root / "stdin").write_text(stdin)
        if os.geteuid() == 0:
            os.chmod(root, 0o711)
            os.chown(work, NOBODY, NOBODY)
        return _launch(root, limits)
    finally:
        remove_folder(root)


def _launch(root: Path, limits: SandboxLimits) -> RunResult:
    status_r, status_w = os.pipe()
    try:
        with open(root / "stdin", "rb") as stdin:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(HARNESS), str(root / "job.json"), str(status_w)],
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                cwd=root,
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
        record_harness(root, proc.pid)
        out, status, timed_out, overflow = _collect(proc, status_r, limits)
    finally:
        _kill(proc)  # the harness's first process in the PID namespace dies, and all of it with it
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        os.close(status_r)
    return _result(proc.returncode, out, status, timed_out, overflow)


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


def _result(returncode, out: bytes, status: str, timed_out: bool, overflow: bool) -> RunResult:
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
        return RunResult(returncode, out, {}, timed_out, overflow, "")
    values, loaded = read_status(lines[ready + 1 :])
    return RunResult(returncode, out, values, timed_out, overflow, lines[ready].partition(" ")[2], loaded)


def read_status(lines: Sequence[str]) -> tuple[dict[int, Any], bool]:
    """The values and the loaded flag in status lines written by (or in the name of) the code.

    Untrusted data: a line that is too long, nested too deeply, not JSON or not a value is skipped,
    so nothing the code writes raises here. The first report of an expression counts.
    """
    values: dict[int, Any] = {}
    loaded = False
    for line in lines:
        report = _parse_line(line)
        if not isinstance(report, dict):
            continue
        if report == {"loaded": True}:
            loaded = True
        elif type(report.get("i")) is int and report["i"] not in values:
            values[report["i"]] = _value(report)
    return values, loaded


def _parse_line(line: str) -> object:
    if len(line) > _STATUS_CAP or _depth(line) > MAX_DEPTH + 4:
        return None
    try:
        return json.loads(line, parse_int=_bounded_int)
    except Exception:  # noqa: BLE001 (ValueError, RecursionError, MemoryError: untrusted text, skipped)
        return None


def _depth(line: str) -> int:
    """An upper bound on the JSON nesting of ``line``: brackets outside strings (fast when there are few)."""
    if line.count("[") + line.count("{") <= MAX_DEPTH:
        return 0
    depth = deepest = 0
    in_string, escaped_at = False, -1
    for mark in _JSON_MARKS.finditer(line):  # only these characters matter
        char, at = mark.group(), mark.start()
        if in_string:
            if at == escaped_at:
                continue
            if char == "\\":
                escaped_at = at + 1
            in_string = char != '"'
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _bounded_int(text: str) -> int:
    if len(text) > 40:  # larger ints are sent as hex ({"int": ...}), whose length is checked
        raise ValueError("int text too long")
    return int(text)


def _value(report: dict) -> Any:
    if set(report) != {"i", "value"}:
        return RAISED
    try:
        return decode(report["value"])
    except Exception:  # noqa: BLE001 (not a plain value: the test fails)
        return RAISED


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):
        if proc.poll() is None:
            proc.kill()
