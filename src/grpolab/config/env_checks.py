"""The built-in environments' ``env.kwargs``, checked with the config (config/checks.py), so that a key out of
range (``retries: -1``) or unknown is one line before any model loads, not a traceback at set-up.

The config layer sits below ``grpolab.envs``, so the table here restates each built-in factory's arguments;
tests/unit/config/test_env_checks_table.py holds it to the factories' signatures and their own refusals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from grpolab.errors import ConfigError


def _int_at_least(low: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _text(v: Any) -> bool:
    return v is None or isinstance(v, str)


_CALL_FORMAT = (lambda v: v in ("hermes", "python"), "hermes or python")
ENV_KWARGS: dict[str, dict[str, tuple[Callable[[Any], bool], str]]] = {
    "calculator": {"call_format": _CALL_FORMAT, "system_prompt": (_text, "a string or null"),
                   "tools_enabled": (lambda v: isinstance(v, bool), "true or false")},
    "python": {"call_format": _CALL_FORMAT, "system_prompt": (_text, "a string or null"),
               "memory_mb": (_int_at_least(32), "an integer >= 32 (MB; Python itself needs ~20)")},
    "gym_retry": {"retries": (_int_at_least(0), "an integer >= 0"),
                  "retry_discount": (lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 1,
                                     "a number in [0, 1]")},
    "trl": {"handle": (lambda v: isinstance(v, str), "the handle grpolab.GRPOTrainer registered for its tools")},
}  # fmt: skip
"""The built-in environments' env.kwargs (grpolab.envs.ENVIRONMENTS; the openenv adapter passes any on): each
key's check and its range in words. tests/unit/envs checks it against the factories' own signatures."""


def check_env_kwargs(name: str | None, kwargs: Mapping[str, Any]) -> None:
    """A built-in environment's env.kwargs, each known and in range: one line now, not a traceback at set-up."""
    if name == "openenv" and not kwargs.get("base_url"):
        raise ConfigError("env.name=openenv needs env.kwargs.base_url: the URL of the OpenEnv server")
    known = ENV_KWARGS.get(name or "")
    if known is None:
        return
    for key, value in kwargs.items():
        if key not in known:
            raise ConfigError(f"env.kwargs.{key}: env.name={name} takes no {key!r}; its kwargs are {', '.join(known)}")
        check, allowed = known[key]
        if not check(value):
            raise ConfigError(f"env.kwargs.{key}={value!r} for env.name={name}: give {allowed}")
