"""A reward's calls run in a worker process that can be killed, so that ``reward.timeout_s`` always holds.

A timeout that only stops waiting (a thread) or raises into the reward (a signal) does not hold for
every reward: a bare ``except:`` swallows the exception, and a call that stays in C code (a
catastrophic regex, a huge ``int ** int``) holds the GIL, so no other thread of the trainer runs
either. A process does not have that problem: past the deadline it is killed (SIGKILL), the call
fails with the contract's timeout message, and the next call starts a new worker.

The worker is a ``fork`` of the trainer made at the reward's first call (the dry run, before the
model loads), so any reward works as it is: lambdas, closures, objects holding state; nothing is
pickled but each call's arguments and result (and the reward's exceptions, with their traceback as
a note). It serves the reward's calls one at a time and keeps the reward's state between them; it
dies with the trainer (PR_SET_PDEATHSIG) or when the reward object is garbage-collected. Ctrl-C
reaches the trainer only. What it changes for a reward: what the reward changes in its own state
stays in the worker, and a reward that needs the trainer's CUDA context cannot run in a fork; such
a reward sets ``in_process = True`` (grpolab's neural rewards do) and then keeps the thread timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import pickle
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Sequence
from typing import Any

from grpolab.errors import RewardError
from grpolab.rewards.errors import SampleError

PR_SET_PDEATHSIG = 1


class WorkerTimeout(Exception):
    """The call did not finish by its deadline; the worker was killed."""


class WorkerDied(Exception):
    """The worker process ended during the call (the reward called os._exit, or crashed)."""


class Worker:
    """One reward's worker process; ``submit`` a call, then wait for its ``result``."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.conn: socket.socket | None = None
        self.pending = False
        self.lock = threading.Lock()
        """Held from submit to result: one call at a time, whichever thread scores."""

    def alive(self) -> bool:
        if self.pid is None:
            return False
        try:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            done = self.pid
        if done:
            self._forget()
        return not done

    def start(self, reward: Any) -> None:
        """Fork the worker now (it is also made at the first call, when there is none)."""
        if not self.alive():
            self._start(reward)

    def submit(self, reward: Any, args: tuple, *, asynchronous: bool = False) -> None:
        """Send one call (``reward(*args)``, or ``reward.acall(*args)`` awaited) to the worker."""
        if self.pending:
            self.kill()  # a call nobody waited for: its answer must not be read as this one's
        request = pickle.dumps((asynchronous, args), pickle.HIGHEST_PROTOCOL)  # before a fork, if it cannot be
        self.start(reward)
        try:
            _send(self.conn, request)  # type: ignore[arg-type]
        except OSError as err:  # it died between two calls (its pipe closed)
            raise WorkerDied(self._status()) from err
        self.pending = True

    def result(self, deadline: float) -> Any:
        """The call's value, or the exception it raised; WorkerTimeout past ``deadline`` (time.monotonic)."""
        try:
            ok, payload = pickle.loads(_receive(self.conn, deadline))  # type: ignore[arg-type]
        except (EOFError, ConnectionError) as err:
            raise WorkerDied(self._status()) from err
        except BaseException:  # the timeout, Ctrl-C: the call is abandoned, and so is the worker
            self.kill()
            raise
        self.pending = False
        if not ok:
            raise _rebuilt(payload)
        if isinstance(payload, list):  # a Gathered call: each reward's exception, as raised
            return [_rebuilt(v) if isinstance(v, BaseException | _Remote) else v for v in payload]
        return payload

    def kill(self) -> None:
        """Kill the worker and what it started in its process group (a reward's subprocess), and reap it."""
        if self.pid is not None:
            _kill_group(self.pid)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
        self._forget()

    def __del__(self) -> None:
        try:  # noqa: SIM105 (contextlib may be gone at interpreter exit)
            self.kill()
        except Exception:  # noqa: BLE001 (then the worker dies with the trainer anyway)
            pass

    def _status(self) -> str:
        """How the worker ended (it closed its pipe: it is ending, or is killed now)."""
        pid = self.pid
        self._forget()
        end = time.monotonic() + 1.0
        try:
            while (status := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < end:  # type: ignore[arg-type]
                time.sleep(0.01)
            if status[0] == 0:
                _kill_group(pid)  # type: ignore[arg-type]
                status = os.waitpid(pid, 0)  # type: ignore[arg-type]
        except (ChildProcessError, ProcessLookupError):
            return "exit status unknown"
        if os.WIFSIGNALED(status[1]):
            return f"killed by signal {os.WTERMSIG(status[1])}"
        return f"exit status {os.waitstatus_to_exitcode(status[1])}"

    def _forget(self) -> None:
        if self.conn is not None:
            _PARENT_ENDS.discard(self.conn)
            self.conn.close()
        self.pid, self.conn, self.pending = None, None, False

    def _start(self, reward: Any) -> None:
        parent_end, child_end = socket.socketpair()
        parent_pid = os.getpid()
        for stream in (sys.stdout, sys.stderr):  # what is buffered is printed once, not twice
            with contextlib.suppress(Exception):
                stream.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the worker; its calls are what the tests check)
            code = 1
            try:
                parent_end.close()
                _leave_siblings()
                _serve(reward, child_end, parent_pid)
                code = 0
            finally:
                os._exit(code)
        with contextlib.suppress(OSError):  # its own process group (also set by the worker: no race)
            os.setpgid(pid, pid)
        child_end.close()
        self.pid, self.conn, self.pending = pid, parent_end, False
        _PARENT_ENDS.add(parent_end)


_HEADER = struct.Struct("!Q")


def _send(conn: socket.socket, payload: bytes) -> None:
    conn.settimeout(None)
    conn.sendall(_HEADER.pack(len(payload)) + payload)


def _receive(conn: socket.socket, deadline: float | None) -> bytes:
    """One message; WorkerTimeout past ``deadline``, however the bytes come (or do not)."""
    header = _read(conn, _HEADER.size, deadline)
    return _read(conn, _HEADER.unpack(header)[0], deadline)


def _read(conn: socket.socket, size: int, deadline: float | None) -> bytes:
    chunks, left = [], size
    while left:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerTimeout
            conn.settimeout(remaining)
        try:
            chunk = conn.recv(min(left, 1 << 20))
        except TimeoutError:
            raise WorkerTimeout from None
        if not chunk:
            raise EOFError("the worker's socket closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:  # not yet its own group leader
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


_PARENT_ENDS: set[socket.socket] = set()
_WORKERS: dict[int, Worker] = {}  # by id() of the reward: one worker per reward object, equal or not
_KEPT: list[Any] = []  # rewards that cannot be weakly referenced: kept alive, so that their id stays theirs


def _drop(key: int) -> None:
    worker = _WORKERS.pop(key, None)
    if worker is not None:
        worker.kill()


def _leave_siblings() -> None:
    """In a new worker: the other workers are the trainer's, not this one's to close, kill or reap."""
    for conn in list(_PARENT_ENDS):
        conn.close()
    _PARENT_ENDS.clear()
    for worker in _WORKERS.values():
        worker.pid, worker.conn, worker.pending = None, None, False


def isolated(reward: Any, timeout_s: float | None) -> bool:
    """Whether ``reward`` runs in a worker process: with a timeout, unless it sets ``in_process = True``."""
    return timeout_s is not None and not getattr(reward, "in_process", False) and hasattr(os, "fork")


def start_workers(rewards: Sequence[Any], timeout_s: float | None) -> None:
    """Fork the workers of ``rewards`` (WeightedReward or reward objects) now, as score_batch would group them.

    Call it before a model loads when no dry run comes first, so that a worker shares almost no memory
    with the trainer (module docstring).
    """
    found = [getattr(r, "reward", r) for r in rewards]
    away = [r for r in found if isolated(r, timeout_s)]
    is_async = [bool(getattr(r, "is_async", False)) and hasattr(r, "acall") for r in away]
    group = tuple(r for r, a in zip(away, is_async, strict=True) if a)  # awaited together, as in score_batch
    for reward in [r for r, a in zip(away, is_async, strict=True) if not a] + ([gathered(group)] if group else []):
        worker_for(reward).start(reward)


def worker_for(reward: Any) -> Worker:
    """The worker of ``reward`` (one per reward object), made on first use and killed when the reward is gone."""
    key = id(reward)
    if key not in _WORKERS:
        _WORKERS[key] = Worker()
        try:
            weakref.finalize(reward, _drop, key)
        except TypeError:
            _KEPT.append(reward)
    return _WORKERS[key]


class Gathered:
    """Async rewards awaited together in one worker's event loop; each one's values, or its exception."""

    def __init__(self, rewards: tuple) -> None:
        self.rewards = rewards
        self.name = "+".join(str(getattr(r, "name", r)) for r in rewards)

    async def acall(self, *args: Any) -> list:
        results = await asyncio.gather(*(r.acall(*args) for r in self.rewards), return_exceptions=True)
        return [_portable(r) if isinstance(r, BaseException) else r for r in results]


_GROUPS: dict[tuple[int, ...], Gathered] = {}  # kept (with their workers) until the process exits


def gathered(rewards: tuple) -> Gathered:
    """The group of these async rewards (the same object, and worker, for the same rewards)."""
    key = tuple(map(id, rewards))
    if key not in _GROUPS or _GROUPS[key].rewards != rewards:
        _GROUPS[key] = Gathered(rewards)
    return _GROUPS[key]


def _serve(reward: Any, conn: socket.socket, parent_pid: int) -> None:
    """The worker's loop: one call at a time, until the trainer closes the pipe or dies."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # killed with what it starts
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the trainer died before the line above
        return
    while True:
        try:
            asynchronous, args = pickle.loads(_receive(conn, None))
        except (EOFError, OSError):
            return
        _send(conn, _reply(reward, asynchronous, args))


def _reply(reward: Any, asynchronous: bool, args: tuple) -> bytes:
    """The pickled (ok, value or exception) of one call."""
    try:
        value = asyncio.run(reward.acall(*args)) if asynchronous else reward(*args)
    except BaseException as exc:  # handed to the trainer, re-raised there
        reply: tuple[bool, Any] = (False, _portable(exc))
    else:
        reply = (True, value)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        return pickle.dumps(reply, pickle.HIGHEST_PROTOCOL)
    except Exception as err:  # noqa: BLE001 (a value pickle cannot send)
        message = (
            f"reward '{getattr(reward, 'name', reward)}' returned {type(reply[1]).__name__}, which cannot be sent "
            f"back from its worker process ({type(err).__name__}: {err}); return a list of floats (or None)"
        )
        return pickle.dumps((False, RewardError(message)), pickle.HIGHEST_PROTOCOL)


class _Remote:
    """An exception that could not be pickled, sent back as its type name, message and notes."""

    def __init__(self, exc: BaseException, notes: list[str], sample: tuple | None = None) -> None:
        self.type_name, self.message, self.notes, self.sample = type(exc).__name__, str(exc), notes, sample


def _portable(exc: BaseException) -> BaseException | _Remote:
    """``exc`` with the worker's traceback as a note, if it survives pickling; else a _Remote of it."""
    note = "(raised in the reward's worker process)\n" + "".join(traceback.format_exception(exc))
    with contextlib.suppress(Exception):
        exc.add_note(note)
    try:
        return pickle.loads(pickle.dumps(exc, pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 (a class pickle cannot find, an __init__ it cannot call)
        if isinstance(exc, SampleError):
            return _Remote(exc.exc, [note], (exc.name, exc.index, exc.example))
        return _Remote(exc, [note])


def _rebuilt(payload: BaseException | _Remote) -> BaseException:
    """The exception to raise in the trainer: as raised, or an Exception of the same type name and message."""
    if isinstance(payload, BaseException):
        return payload
    exc = type(payload.type_name, (Exception,), {"__module__": "reward worker"})(payload.message)
    if payload.sample is not None:
            exc = SampleError(*payload.sample, exc)
    for note in payload.notes:
        exc.add_note(note)
    return exc
