"""Reward calls bounded by ``reward.timeout_s``, wherever the reward runs.

With a timeout, a reward runs in a worker process (grpolab.rewards.worker), killed when the time is
up, so the timeout holds whatever the reward does (a bare ``except:``, a catastrophic regex in C),
unless the reward sets ``in_process = True``. Those run in the trainer:

* a reward with ``main_thread = True`` (a synchronous TRL function, whose math-verify calls use
  signal.alarm) in the main thread, interrupted there between bytecodes;
* the others in a daemon ``threading.Thread`` rather than a ``concurrent.futures`` pool: a pool's
  threads are joined at interpreter exit, so one reward stuck forever would keep the process from
  exiting after the error. A daemon thread is abandoned instead.

Without a timeout (``timeout_s=None``) every reward is called directly. Failures of the bound itself
are TimedOut, worker.WorkerDied and Unsendable; rewards.base turns them into the contract's messages.
"""

from __future__ import annotations

import _thread
import asyncio
import contextlib
import pickle
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from grpolab.rewards.worker import Worker, WorkerTimeout, gathered, isolated, worker_for


class TimedOut(Exception):
    """The call took longer than its timeout."""


class Unsendable(Exception):
    """The batch could not be pickled for the reward's worker process."""


def call_bounded(reward: Any, args: tuple, timeout_s: float | None) -> Any:
    """``reward(*args)`` within ``timeout_s`` (module docstring); the reward's own exceptions pass through."""
    if isolated(reward, timeout_s):
        worker = worker_for(reward)
        with worker.lock:
            _submit(worker, reward, args, asynchronous=False)
            return _result(worker, time.monotonic() + timeout_s)  # type: ignore[operator]
    call = lambda: reward(*args)  # noqa: E731
    if getattr(reward, "main_thread", False) and timeout_s is not None and _can_interrupt_main():
        return _bounded_in_main(call, timeout_s)
    return _bounded(call, timeout_s, getattr(reward, "name", "reward"))


def gather_bounded(rewards: Sequence[Any], args: tuple, timeout_s: float | None) -> list:
    """Each async reward's ``acall(*args)``, awaited together within ``timeout_s``: its values, or its exception.

    Those that run in worker processes are awaited together in one worker's event loop (as TRL awaits
    them), the others in a fresh loop here, at the same time.
    """
    away = [i for i, reward in enumerate(rewards) if isolated(reward, timeout_s)]
    here = [i for i in range(len(rewards)) if i not in away]
    group = gathered(tuple(rewards[i] for i in away)) if away else None
    worker = worker_for(group) if group is not None else None
    with worker.lock if worker is not None else contextlib.nullcontext():
        start = time.monotonic()
        if worker is not None:
            _submit(worker, group, args, asynchronous=True)
        try:
            results = dict(zip(here, _gather_here([rewards[i] for i in here], args, timeout_s), strict=True))
            if worker is not None:
                results.update(zip(away, _result(worker, start + timeout_s), strict=True))  # type: ignore[operator]
        finally:
            if worker is not None and worker.pending:  # not waited for (the others failed): stopped
                worker.kill()
    return [results[i] for i in range(len(rewards))]


def _gather_here(rewards: list, args: tuple, timeout_s: float | None) -> list:
    if not rewards:
        return []

    async def gather() -> list:
        return await asyncio.gather(*(reward.acall(*args) for reward in rewards), return_exceptions=True)

    return _bounded(lambda: asyncio.run(gather()), timeout_s, "async")  # type: ignore[return-value]


def _submit(worker: Worker, reward: Any, args: tuple, *, asynchronous: bool) -> None:
    try:
        worker.submit(reward, args, asynchronous=asynchronous)
    except (pickle.PicklingError, TypeError, AttributeError) as err:
        raise Unsendable(f"{type(err).__name__}: {err}") from err


def _result(worker: Worker, deadline: float) -> Any:
    try:
        return worker.result(deadline)
    except WorkerTimeout:
        raise TimedOut from None


def bounded_in_main(fn: Callable[[], object], timeout_s: float) -> object:
    """``fn()`` within ``timeout_s`` (TimedOut past it) when called from the main thread, interrupted there
    between bytecodes (``_bounded_in_main``); from another thread, ``fn()`` unbounded. For work that must run
    in the calling thread, such as an in-process inference engine."""
    if not _can_interrupt_main():
        return fn()
    return _bounded_in_main(fn, timeout_s)


class _Timeout(BaseException):
    """Raised in the main thread by _bounded_in_main's timer; BaseException so `except Exception` in a reward lets it by."""


def _can_interrupt_main() -> bool:
    return threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGUSR2")


def _bounded_in_main(fn: Callable[[], object], timeout_s: float) -> object:
    """Run ``fn`` in the main thread, interrupted after ``timeout_s`` (between bytecodes, so a call stuck
    inside C code is interrupted only when it returns; a bare ``except:`` in it swallows the interruption).

    For in-process rewards that need the main thread: math-verify's default timeout (TRL's documented
    accuracy reward) uses signal.alarm, which raises ValueError in any other thread.
    """
    done = threading.Event()

    def on_timer(signum, frame) -> None:
        if not done.is_set():
            raise _Timeout

    previous = signal.signal(signal.SIGUSR2, on_timer)
    timer = threading.Timer(timeout_s, _thread.interrupt_main, args=(signal.SIGUSR2,))
    timer.daemon = True
    timer.start()
    try:
        value = fn()
        done.set()
        return value
    except _Timeout:
        raise TimedOut from None
    finally:
        done.set()
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGUSR2, previous)


def _bounded(fn: Callable[[], object], timeout_s: float | None, name: str) -> object:
    """Run ``fn`` in a daemon thread, abandoned after ``timeout_s`` (it cannot be stopped there)."""
    if timeout_s is None:
        return fn()
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread, re-raised there
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"reward-{name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimedOut
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]
