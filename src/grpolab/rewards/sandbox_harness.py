"""The first code to run inside a sandbox process (``python -I -S sandbox_harness.py JOB STATUS_FD``).

Started by grpolab.rewards.sandbox, never imported: standard library only. It reads the job (code,
tests, limits) while it still has the rights of its parent, isolates itself, reports ``ready`` on the
status pipe, and only then runs the untrusted code. See sandbox.py for what is enforced.

Status lines: ``error <why>`` (isolation failed; the code never ran), ``ready <isolation>``, then in
asserts mode ``pass <nonce> <i>`` for each test that ran without raising.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWUSER = 0x00020000, 0x40000000, 0x10000000
PR_SET_NO_NEW_PRIVS = 38
_OPTION_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    return libc


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(libc, source, target, flags: int) -> None:
    enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
    _check(libc.mount(enc(source), enc(target), None, flags, None), f"mount {target}")


def _mount_points() -> list[tuple[str, int]]:
    """(mount point, nosuid/nodev/noexec flags to keep) of every mount, parents first."""
    out = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            target = fields[4].encode().decode("unicode_escape")  # \040 for a space
            keep = sum(flag for opt, flag in _OPTION_FLAGS.items() if opt in fields[5].split(","))
            out.append((target, keep))
    return out


def _others_can_read(path: str) -> bool:
    parts = os.path.abspath(path).split(os.sep)
    for i in range(1, len(parts) + 1):
        mode = os.stat(os.sep.join(parts[:i]) or os.sep).st_mode
        if not mode & 0o001 or (i == len(parts) and not mode & 0o004):
            return False
    return True


def _namespaces(libc, job: dict) -> list[str]:
    """New mount and network namespaces: no network, every mount read-only except the work folder."""
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET), "unshare")
    _mount(libc, None, "/", MS_REC | MS_PRIVATE)  # nothing below propagates back to the host
    stdlib = os.path.dirname(os.__file__)
    if not _others_can_read(stdlib):  # e.g. a pyenv Python under /root: show it at a readable path
        prefix, view = sys.base_prefix, job["python_view"]
        _mount(libc, prefix, view, MS_BIND | MS_REC)
        sys.path[:] = [view + p[len(prefix) :] if p.startswith(prefix) else p for p in sys.path]
        sys.path_importer_cache.clear()
    work = job["work"]
    _mount(libc, work, work, MS_BIND)  # its own mount, left writable
    writable = []
    for target, keep in _mount_points():
        if target == work:
            continue
        try:
            _mount(libc, None, target, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)
        except OSError:
            if target == "/":
                raise
            writable.append(target)
    return ["netns", "rofs" + (f"(not {','.join(writable)})" if writable else "")]


def _guard_network() -> None:
    """Best effort only (code can reach the C library another way): the socket module refuses."""
    import socket

    def refuse(*args, **kwargs):
        raise PermissionError("network access is disabled in the grpolab sandbox")

    class NoSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            refuse()

    socket.socket = NoSocket  # type: ignore[misc]
    socket.create_connection = refuse  # type: ignore[assignment]
    socket.socketpair = refuse  # type: ignore[assignment]


def _isolate(job: dict) -> str:
    libc = _libc()
    done = []
    if os.geteuid() == 0:
        try:
            done += _namespaces(libc, job)
        except OSError:
            _guard_network()
            done.append("pynet")
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl")
        os.setgroups([])
        os.setgid(job["gid"])
        os.setuid(job["uid"])
        done.insert(0, f"uid{job['uid']}")
    else:
        try:
            _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNET), "unshare")
            done.append("netns")
        except OSError:
            _guard_network()
            done.append("pynet")
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl")
    limits = job["limits"]
    for name, value in limits.items():
        hard = value + 1 if name == "RLIMIT_CPU" else value  # SIGXCPU first, then SIGKILL
        resource.setrlimit(getattr(resource, name), (value, hard))
    os.chdir(job["work"])
    return "+".join(done)


def _run_asserts(job: dict, status) -> int:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # what the code prints is discarded: only the status pipe reports
    os.dup2(null, 2)
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(compile(job["code"], "solution.py", "exec"), namespace)
    except BaseException:  # SystemExit included: exiting early is not passing
        return 1
    nonce = job["nonce"]
    for i, test in enumerate(job["tests"]):
        try:
            exec(compile(test, f"test_{i}.py", "exec"), namespace)
        except BaseException:
            continue
        status.write(f"pass {nonce} {i}\n")
    return 0


def _run_program(job: dict) -> int:
    sys.argv = ["solution.py"]
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(job["code"], "solution.py", "exec"), namespace)
    except SystemExit as exc:
        return 0 if exc.code in (None, 0) else 1
    except BaseException:
        return 1
    return 0


def main() -> int:
    status = os.fdopen(int(sys.argv[2]), "w", buffering=1)
    try:
        with open(sys.argv[1]) as fh:
            job = json.load(fh)
        isolation = _isolate(job)
    except Exception as exc:  # reported to the parent; no untrusted code has run
        status.write(f"error {type(exc).__name__}: {exc}\n")
        return 3
    status.write(f"ready {isolation}\n")
    if job["mode"] == "asserts":
        return _run_asserts(job, status)
    status.close()  # the program gets no channel to the parent besides stdout
    return _run_program(job)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
