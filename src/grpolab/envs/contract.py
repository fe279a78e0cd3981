"""What an environment hands back, checked where it enters the rollout, and the loop its episodes run in.

A custom environment that breaks the contract (envs.base) fails with one line naming it and what to
return, instead of a traceback deep in the rollout: ``reset`` must return a list of chat messages,
``step`` an ``EnvStep`` whose reward is None or a finite number. Text from an environment or a tool
that holds lone surrogates (a byte string decoded with ``surrogateescape``, a cut UTF-16 pair) cannot
be tokenized or written as UTF-8: each one is replaced by U+FFFD, and the episode goes on.

During training a step that raises (a ConnectionResetError from a remote service that is gone), breaks the
contract or does not return in time fails its episode (``guarded_step`` returns the Failure instead of
raising): the rollout runs it again from a fresh environment or drops its group (docs/training.md, "Failed
samples"), so the one line above becomes a run's stop only when too many groups fail.

The episodes' steps run in an event loop of their own, in a daemon thread (``EnvLoop``). Each async step is
cut at ``env.step_timeout_s`` (``guarded_step``); a step that blocks the event loop itself (``time.sleep``
in an ``async def``, a sync step that hangs) cannot be cut there, so the rollout waits on the whole turn a
little longer and then gives up on the loop (``EnvTimedOut``): every episode of that loop is stuck with it.
The thread is abandoned, never joined.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import math
import numbers
import threading
from collections.abc import Coroutine, Mapping
from typing import Any

from grpolab.envs.base import EnvStep, Message, clean_text
from grpolab.errors import GrpolabError, one_line
from grpolab.sandbox.runner import SandboxError
from grpolab.types import Failure

log = logging.getLogger(__name__)

_RETURN_STEP = "return grpolab.envs.EnvStep(messages=[...], reward=None or a number, done=True or False)"
_RETURN_RESET = "return the first chat messages, a list of {'role': ..., 'content': ...} dicts"


class EnvError(GrpolabError, RuntimeError):
    """An environment broke its contract or hung; the message names it and what it must do."""


class EnvTimedOut(EnvError):
    """A turn's steps did not return within the loop's bound: the event loop is stuck (module docstring)."""


_LOOP_GRACE_S = 1.0
"""How much longer than env.step_timeout_s ``EnvLoop.run`` waits: long enough for the steps cut at the timeout
(``guarded_step``) to come back, so that only a blocked loop is given up on."""


def env_name(env: object) -> str:
    kind = type(env)
    return f"{kind.__module__}.{kind.__qualname__}"


def checked_messages(env: object, messages: object, what: str, fix: str) -> list[Message]:
    if not isinstance(messages, list | tuple) or not all(isinstance(m, Mapping) for m in messages):
        raise EnvError(f"environment {env_name(env)}: {what} returned {_shown(messages)}; {fix}")
    out = []
    for m in messages:
        content = m.get("content")
        if not isinstance(m.get("role"), str) or not isinstance(content, str | None):
            raise EnvError(
                f"environment {env_name(env)}: {what} returned a message {_shown(m)}; each message needs a "
                "'role' string and a 'content' string"
            )
        out.append({**m, "content": clean_text(content)} if isinstance(content, str) else dict(m))
    return out


def checked_reset(env: object, messages: object) -> list[Message]:
    return checked_messages(env, messages, "reset(example)", _RETURN_RESET)


def checked_step(env: object, step: object) -> EnvStep:
    name = env_name(env)
    if not isinstance(step, EnvStep):
        raise EnvError(f"environment {name}: step(model_turn) returned {_shown(step)}; {_RETURN_STEP}")
    reward = step.reward
    if reward is not None and (
        isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward))
    ):
        raise EnvError(
            f"environment {name}: step(model_turn) returned reward {_shown(reward)}; the reward must be None "
            "(no reward this turn) or a finite number"
        )
    messages = checked_messages(env, step.messages, "step(model_turn)", _RETURN_STEP) if not step.done else []
    return EnvStep(messages, reward, bool(step.done), int(step.tool_calls), int(step.tool_errors))


async def guarded_step(env: object, model_turn: str, timeout_s: float) -> EnvStep | Failure:
    """``env.step(model_turn)``, checked; or the Failure it ended in (module docstring): a step that raised or broke
    the contract (env_error; sandbox_error when its sandbox could not run) or that did not return within
    ``timeout_s`` (env_timeout; only an async step can be cut here)."""
    try:
        result = env.step(model_turn)  # type: ignore[attr-defined]
        if inspect.isawaitable(result):
            result = await asyncio.wait_for(result, timeout_s)
        return checked_step(env, result)
    except TimeoutError as exc:  # asyncio.wait_for's, or the environment's own client timing out
        said = f" ({type(exc).__name__}: {exc})" if str(exc) else ""
        return Failure(
            "env_timeout",
            f"environment {env_name(env)}: step(model_turn) did not return within env.step_timeout_s={timeout_s:g} s"
            f"{said}",
        )
    except Exception as exc:  # noqa: BLE001 - whatever a custom environment raises fails its episode only
        return env_failure(env, "step(model_turn)", exc)


def env_failure(env: object, what: str, exc: Exception) -> Failure:
    """The Failure of ``what`` (``reset(example)``, ``step(model_turn)``) that raised ``exc``."""
    if isinstance(exc, EnvError):  # the contract's own message names the environment and the fix
        return Failure("env_error", one_line(exc))
    kind = "sandbox_error" if isinstance(exc, SandboxError) else "env_error"
    who = f"environment {env_name(env)}: {what}" if env is not None else "making an environment (env.name)"
    return Failure(kind, one_line(f"{who} raised {type(exc).__name__}: {exc}"))


def _shown(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:80]}{'...' if len(text) > 80 else ''}"


class EnvLoop:
    """An event loop in a daemon thread; ``run`` waits for a coroutine at most ``timeout_s``."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        """env.step_timeout_s: the bound of each step (``guarded_step``); ``run`` waits a little longer."""
        self.loop = asyncio.new_event_loop()
        self.stuck = False
        self.thread = threading.Thread(target=self.loop.run_forever, name="grpolab-env", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], what: str) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(self.timeout_s + _LOOP_GRACE_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            self.stuck = True
            raise EnvTimedOut(
                f"{what} did not return within env.step_timeout_s={self.timeout_s:g} s (a hang, or a blocking "
                "call such as time.sleep inside an async step or tool); make it return, or raise env.step_timeout_s"
            ) from None

    def close(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` (the environments' close), then stop the loop. A stuck loop is left to its daemon
        thread, abandoned as a hung tool is: stopping it would only destroy its pending tasks."""
        if self.stuck:
            coro.close()
            return
        try:
            self.run(coro, "closing the environments")
        except Exception as exc:  # noqa: BLE001 (a server gone already: nothing left to close)
            log.warning("closing the environments failed (%s: %s); going on", type(exc).__name__, exc)
        if self.stuck:  # closing itself hung
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(self.timeout_s)
        if not self.thread.is_alive():
            self.loop.close()
