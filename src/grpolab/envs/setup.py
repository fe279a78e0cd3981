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


def episode_sampler(sampler, tokenizer, make_env: MakeEnv | None, env: EnvConfig):
    """The sampler itself without an environment; else a MultiTurnSampler over it."""
    if make_env is None:
        return sampler
    from grpolab.rollout.multiturn import MultiTurnSampler

    return MultiTurnSampler(
        sampler, tokenizer, make_env, max_turns=env.max_turns, max_episode_tokens=env.max_episode_tokens,
        step_timeout_s=env.step_timeout_s,
    )
