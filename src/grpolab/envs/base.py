"""The environment contract (Gymnasium-like, over text) and tools with bounded, logged failures.

An ``Environment`` runs one episode at a time:

* ``reset(example) -> messages``: the first chat messages (what the model is asked). They must be a
  function of the example alone: the prompt is tokenized once, before training, like every prompt.
* ``step(model_turn) -> EnvStep(messages, reward, done)``: the model's turn (decoded text) in, the
  environment's answer out (tool results, feedback; empty when done), an optional reward for the turn
  and whether the episode is over. ``step`` may be ``async def``: the rollout awaits every running
  episode's step together (``asyncio.gather``), so many episodes wait on their tools at once.
* ``tools``: the tools as JSON schemas, the way chat templates expect them
  (``tokenizer.apply_chat_template(messages, tools=env.tools)``), so a tool-calling chat model sees
  its native format. Empty for environments without tools.
* optionally ``environment``: after ``reset``, the object whose state the episode's tools change (a TRL
  ``environment_factory``'s object, envs/trl_env.py); the episode keeps it (``Episode.environment``) for the
  rewards that read it (TRL's ``environments``).

Per-turn rewards are summed into the episode's reward (``Episode.env_reward``), which the ``env``
reward function hands to GRPO; other reward functions see the whole conversation as text.

A tool is a Python callable (sync or async) run through ``run_tool``: it is cut off at
``ToolLimits.timeout_s`` (it runs in a daemon thread that is abandoned, as rewards/base.py does; an
async tool in an event loop of its own there, so one that blocks its loop is cut too), its output is cut to ``max_output_chars``, and an exception becomes an error message. Each
failure is logged; the episode then goes on with the message, or ends with reward 0
(``on_error="end"``). A run never crashes on a tool and a prompt never grows without bound. Only a sandbox
that cannot run a tool's code (``SandboxError``, the machine's failure, not the model's) fails the episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, Protocol, runtime_checkable

from grpolab.sandbox.runner import SandboxError
from grpolab.types import Example

log = logging.getLogger(__name__)

Message = dict[str, Any]
"""A chat message: ``{"role": ..., "content": ...}`` (tool results: ``role="tool"`` and ``name``)."""


@dataclass(frozen=True)
class EnvStep:
    """The environment's answer to one model turn."""

    messages: list[Message] = field(default_factory=list)
    """What goes back to the model (tool results, feedback); ignored when ``done``."""
    reward: float | None = None
    """This turn's reward, or None; an episode's rewards are summed."""
    done: bool = False
    tool_calls: int = 0
    """Tool calls run in this step (counted in Episode.tool_calls)."""
    tool_errors: int = 0
    """Tool calls that failed, timed out or were cut."""


@runtime_checkable
class Environment(Protocol):
    tools: Sequence[Mapping[str, Any]]

    def reset(self, example: Example) -> list[Message]: ...

    def step(self, model_turn: str) -> EnvStep: ...  # or ``async def``


@dataclass(frozen=True)
class ToolLimits:
    """How a tool call is bounded (config: env.tool_timeout_s, env.max_tool_output_chars, env.on_tool_error)."""

    timeout_s: float = 10.0
    max_output_chars: int = 2000
    on_error: Literal["message", "end"] = "message"
    """"message": the model reads the error and goes on; "end": the episode ends with reward 0."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.max_output_chars < 1:
            raise ValueError("tool timeout_s must be > 0 and max_output_chars >= 1")


@dataclass(frozen=True)
class ToolResult:
    text: str
    """What the model reads: the output (cut to max_output_chars) or the error message."""
    error: str | None = None
    """None, or why the call failed: "raised", "timeout", "too_long", "unknown_tool", "bad_arguments"."""


@dataclass(frozen=True)
class Tool:
    """A callable the model may call by name; ``schema`` is the JSON schema chat templates render."""

    name: str
    fn: Callable[..., Any]
    schema: Mapping[str, Any]

    @classmethod
    def from_function(cls, fn: Callable[..., Any], name: str | None = None) -> Tool:
        """The schema from the function's signature and Google-style docstring (transformers' own reader)."""
        from transformers.utils import get_json_schema

        schema = get_json_schema(fn)
        if name is not None:
            schema = {**schema, "function": {**schema["function"], "name": name}}
        return cls(schema["function"]["name"], fn, schema)


async def run_tool(tool: Tool | None, arguments: Mapping[str, Any], limits: ToolLimits) -> ToolResult:
    """Call ``tool(**arguments)`` within ``limits``; never raises for the tool's own failures. A sandbox that could
    not run the tool's code (SandboxError: not the model's doing) is raised: its episode fails (docs/training.md)."""
    if tool is None:
        return _failed("unknown_tool", "error: no such tool")
    try:
        # An async tool runs in an event loop of its own, in a daemon thread, like a sync one: one that blocks
        # its loop (time.sleep in an async def) would otherwise block the rollout's and outlive the timeout.
        fn = partial(_run_coroutine, tool.fn) if inspect.iscoroutinefunction(tool.fn) else tool.fn
        output = await asyncio.wait_for(_in_daemon_thread(fn, arguments), limits.timeout_s)
    except TimeoutError:
        _log_failure(tool.name, "timeout", f"timed out after {limits.timeout_s:g} s")
        return _failed("timeout", f"error: the tool {tool.name} timed out after {limits.timeout_s:g} s")
    except SandboxError:
        raise
    except TypeError as exc:  # wrong or missing arguments from the model
        return _failed("bad_arguments", _bounded(clean_text(f"error: {exc}"), limits.max_output_chars))
    except Exception as exc:  # the tool's bug or the model's bad input: the model reads it, the run goes on
        what = clean_text(f"{type(exc).__name__}: {exc}")
        _log_failure(tool.name, "raised", f"raised {what}")
        return _failed("raised", _bounded(f"error: {what}", limits.max_output_chars))
    text = clean_text(output if isinstance(output, str) else repr(output))
    if len(text) > limits.max_output_chars:
        _log_failure(tool.name, "too_long", f"returned {len(text)} characters, cut to {limits.max_output_chars}")
        return ToolResult(_bounded(text, limits.max_output_chars), "too_long")
    return ToolResult(text)


_WARNED: set[tuple[str, str]] = set()


_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD: it can then be tokenized, logged and written as
    UTF-8 (a tool's bytes decoded with ``surrogateescape``, a cut UTF-16 pair; envs.contract)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def _log_failure(tool: str, kind: str, what: str) -> None:
    """The first failure of each kind per tool is a warning, the rest debug lines: a model that writes bad
    calls all the time must not flood the log (tools/failure_frequency counts them every step)."""
    level = logging.DEBUG if (tool, kind) in _WARNED else logging.WARNING
    _WARNED.add((tool, kind))
    log.log(level, "tool %s %s; the model reads an error instead (further ones: DEBUG)", tool, what[:300])


def _failed(error: str, text: str) -> ToolResult:
    return ToolResult(text, error)


def _bounded(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the cut said at the end (within the limit)."""
    if len(text) <= limit:
        return text
    note = f"...[cut {len(text) - limit} chars]"
    return text[: max(limit - len(note), 0)] + note[:limit]


def _run_coroutine(fn: Callable[..., Any], **arguments: Any) -> Any:
    return asyncio.run(fn(**arguments))


def _in_daemon_thread(fn: Callable[..., Any], arguments: Mapping[str, Any]) -> asyncio.Future:
    """Run a sync tool in a daemon thread: one that hangs forever is abandoned, never joined at exit."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def target() -> None:
        try:
            value, ok = fn(**arguments), True
        except BaseException as exc:  # handed to the awaiting coroutine, which decides
            value, ok = exc, False
        with contextlib.suppress(RuntimeError):  # the loop closed while a timed-out tool ran on
            loop.call_soon_threadsafe(settle, ok, value)

    threading.Thread(target=target, name="grpolab-tool", daemon=True).start()
    return future
