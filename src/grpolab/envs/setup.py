"""From the config's ``env`` section to a run's environment: chosen once, at set-up."""

from __future__ import annotations

from grpolab.config.sections import EnvConfig
from grpolab.envs import MakeEnv, build_environment
from grpolab.envs.base import ToolLimits


def environment_from_config(env: EnvConfig) -> MakeEnv | None:
    """``make_env`` for ``env.name`` (None when unset: one completion per prompt). Fails before any model loads."""
    if env.name is None:
        return None
    limits = ToolLimits(env.tool_timeout_s, env.max_tool_output_chars, env.on_tool_error)
    return build_environment(env.name, env.kwargs, limits)



def offers_environments(make_env: MakeEnv | None) -> bool:
    """Whether each episode of ``make_env``'s environments keeps an environment object (a TRL ``environment_factory``:
    envs/trl_env.py), which TRL-style rewards then receive as ``environments``."""
    return make_env is not None and bool(getattr(make_env(), "offers_environment", False))
