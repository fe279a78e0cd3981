"""Environments for multi-turn rollouts: the contract (base), tools, built-ins and adapters.

``ENVIRONMENTS`` maps a name (config ``env.name``) to a factory ``(limits: ToolLimits, **env.kwargs) ->
make_env``, where ``make_env()`` returns a fresh ``Environment`` for one episode. ``env.name`` may also be
``"package.module:attribute"``: a class or function that, called with ``env.kwargs``, returns one
Environment (a fresh one per episode).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from grpolab.envs.base import Environment, EnvStep, Message, Tool, ToolLimits, ToolResult, run_tool
from grpolab.envs.openenv import OpenEnvAdapter
from grpolab.envs.retry import GymRetryEnv
from grpolab.envs.tools import ToolEnv, calculator, python_tool
from grpolab.envs.trl_env import TrlEnvironment
from grpolab.errors import ConfigError

MakeEnv = Callable[[], Environment]


def _calculator(
    limits: ToolLimits,
    call_format: str = "hermes",
    system_prompt: str | None = None,
    tools_enabled: bool = True,
) -> MakeEnv:

    tool = Tool.from_function(calculator)
    return partial(
        ToolEnv,
        [tool],
        call_format=call_format,
        limits=limits,
        system_prompt=system_prompt,
        tools_enabled=tools_enabled,
    )


def _python(
    limits: ToolLimits, call_format: str = "hermes", system_prompt: str | None = None, memory_mb: int = 512
) -> MakeEnv:

    # the sandbox's own wall limit sits inside the tool's timeout, so the process is killed, not abandoned
    tool = python_tool(timeout_s=max(limits.timeout_s - 1.0, 0.5), memory_mb=memory_mb)
    return partial(ToolEnv, [tool], call_format=call_format, limits=limits, system_prompt=system_prompt)


def _gym_retry(limits: ToolLimits, retries: int = 1, retry_discount: float = 1.0) -> MakeEnv:

    return partial(GymRetryEnv, retries=retries, retry_discount=retry_discount)


def _openenv(limits: ToolLimits, base_url: str, **kwargs: Any) -> MakeEnv:

    return partial(OpenEnvAdapter, base_url, timeout_s=limits.timeout_s, **kwargs)


def _trl(limits: ToolLimits, handle: str) -> MakeEnv:

    return partial(TrlEnvironment, handle, limits)


ENVIRONMENTS: dict[str, Callable[..., MakeEnv]] = {
    "calculator": _calculator,
    "python": _python,
    "gym_retry": _gym_retry,
    "openenv": _openenv,
    "trl": _trl,  # TRL's tools / environment_factory given to grpolab.GRPOTrainer (envs/trl_env.py)
}


def build_environment(name: str, kwargs: Mapping[str, Any], limits: ToolLimits) -> MakeEnv:
    """``make_env`` for config ``env.name`` / ``env.kwargs``; a bad name or argument is a ConfigError."""
    if name in ENVIRONMENTS:
        factory = partial(ENVIRONMENTS[name], limits)
    elif ":" in name:
        module, _, attr = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"env.name={name!r}: cannot import it ({exc})") from exc
        made = factory
        factory = lambda **kw: partial(made, **kw)  # noqa: E731 - a class or function per episode
    else:
        raise ConfigError(
            f"env.name={name!r} is unknown; choose one of {sorted(ENVIRONMENTS)} or 'package.module:attribute'"
        )
    try:
        make_env = factory(**dict(kwargs))
        env = make_env()  # built once now: a bad argument fails before any model loads
    except (TypeError, ValueError) as exc:  # a missing or unknown argument, or one out of range
        raise ConfigError(f"env.kwargs={dict(kwargs)} do not fit env.name={name!r}: {exc}") from exc
    missing = [m for m in ("reset", "step") if not callable(getattr(env, m, None))]
    if missing or not isinstance(getattr(env, "tools", None), list | tuple):
        what = f"no {' or '.join(missing)} method" if missing else "no tools list (an empty list for none)"
        raise ConfigError(
            f"env.name={name!r} made a {type(env).__name__} with {what}: an environment has reset(example) -> "
            "messages, step(model_turn) -> EnvStep and tools (grpolab.envs.Environment; docs/multiturn.md)"
        )
    return make_env


__all__ = [
    "ENVIRONMENTS",
    "EnvStep",
    "Environment",
    "Message",
    "Tool",
    "ToolLimits",
    "ToolResult",
    "build_environment",
    "run_tool",
]
