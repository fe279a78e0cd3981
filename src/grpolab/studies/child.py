"""One stage of a study in a process of its own, so that what it allocates is returned when it ends.

A study runs many stages in one command. An evaluation on the colocated vLLM engine keeps gigabytes of the
parent's memory after the engine is closed (the allocator does not hand them back), and a training run in a
child process then adds its own peak on top: on a 24 GB machine `make claims` was killed for memory while
its fourth training run started. ``in_child`` runs a stage in a spawned process instead; the stage writes
its output where the parent reads it back, or returns a small picklable value.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Callable
from typing import Any, TypeVar

from grpolab.errors import GrpolabError

T = TypeVar("T")


class ChildStageError(GrpolabError, RuntimeError):
    """A stage's process died without an answer (killed, out of memory, or a bug whose traceback it printed)."""


def in_child(what: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a spawned process: its value, or its GrpolabError raised here; ``fn`` must be a module-level
    function. Ctrl-C reaches the child too (one process group); anything that stops the parent stops the child."""
    ctx = multiprocessing.get_context("spawn")
    answer, child_end = ctx.Pipe(duplex=False)
    level = logging.getLogger().getEffectiveLevel()
    proc = ctx.Process(target=_run, args=(child_end, level, fn, args), name=f"grpolab {what}")
    proc.start()
    child_end.close()
    try:
        try:
            ok, value = answer.recv()
        except EOFError:
            proc.join()
            hint = ": killed, out of memory?" if proc.exitcode == -9 else ""
            raise ChildStageError(
                f"{what} ran in its own process, which exited with code {proc.exitcode}{hint} without an answer; "
                "run the same command again to continue from the last finished stage"
            ) from None
        proc.join()
    finally:
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=60)
        answer.close()
    if not ok:
        raise value
    return value


def _run(conn: Any, level: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        result = (True, fn(*args))
    except GrpolabError as err:  # the user's to fix: one line in the parent; anything else is a bug, printed here
        result = (False, err)
    except KeyboardInterrupt:  # Ctrl-C reached the whole group: the parent reports it
        conn.close()
        return
    conn.send(result)
    conn.close()
