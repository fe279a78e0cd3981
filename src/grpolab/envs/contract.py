"""What an environment hands back, checked where it enters the rollout, and the loop its episodes run in.

A custom environment that breaks the contract (envs.base) fails with one line naming it and what to
return, instead of a traceback deep in the rollout: ``reset`` must return a list of chat messages,
``step`` an ``EnvStep`` whose reward is None or a finite number. Text from an environment or a tool
that holds lone surrogates (a byte string decoded with ``surrogateescape``, a cut UTF-16 pair) cannot
be tokenized or written as UTF-8: each one is replaced by U+FFFD, and the episode goes on.

The episodes' steps run in an event loop of their own, in a daemon thread (``EnvLoop``), and the
rollout waits on them at most ``env.step_timeout_s``: a step that never returns, even one that blocks
its event loop (``time.sleep`` in an ``async def``), stops the run with one line naming the setting,
since every episode of that loop is stuck with it; the thread is abandoned, never joined.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import numbers
import threading
from collections.abc import Coroutine, Mapping
from typing import Any

from grpolab.envs.base import EnvStep, Message, clean_text
from grpolab.errors import GrpolabError

log = logging.getLogger(__name__)

_RETURN_STEP = "return grpolab.envs.EnvStep(messages=[...], reward=None or a number, done=True or False)"
_RETURN_RESET = "return the first chat messages, a list of {'role': ..., 'content': ...} dicts"


class EnvError(GrpolabError, RuntimeError):
    """An environment broke its contract or hung; the message names it and what it must do."""


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


def _shown(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:80]}{'...' if len(text) > 80 else ''}"


class EnvLoop:
    """An event loop in a daemon thread; ``run`` waits for a coroutine at most ``timeout_s``."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.loop = asyncio.new_event_loop()
        self.stuck = False
        self.thread = threading.Thread(target=self.loop.run_forever, name="grpolab-env", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], what: str) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(self.timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            self.stuck = True
            raise EnvError(
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
