"""TRL's ``reward_funcs`` (with ``reward_weights`` and ``reward_processing_classes``) as grpolab rewards, and
what the run's config.yaml records for each (grpolab.api)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from grpolab.errors import ConfigError, GrpolabError
from grpolab.rewards import REWARDS, TrlReward, WeightedReward, build_reward, reward_from_object

RewardFunc = str | Callable[..., Any] | Mapping[str, Any]
"""A name, a function or object, or a config's ``reward.functions`` entry as a dict (``{"name": ..., "alias": ...}``)."""


def build_reward_funcs(
    reward_funcs: RewardFunc | Sequence[RewardFunc],
    reward_weights: Sequence[float] | None = None,
    tokenizers: Sequence[str | None] | None = None,
) -> list[WeightedReward]:
    """TRL's ``reward_funcs`` (and ``reward_weights``) as grpolab rewards; an error names ``reward_funcs[i]``.
    ``tokenizers``: per reward, the tokenizer of a reward model (TRL's reward_processing_classes) or None."""
    funcs = as_list(reward_funcs)
    if not funcs:
        raise ConfigError("reward_funcs is empty: give at least one reward function or name")
    weights = [1.0] * len(funcs) if reward_weights is None else list(reward_weights)
    if len(weights) != len(funcs):
        raise ConfigError(f"reward_weights has {len(weights)} values for {len(funcs)} reward_funcs: give one per reward")
    rewards: list[WeightedReward] = []
    tokenizers = list(tokenizers) if tokenizers is not None else [None] * len(funcs)
    for i, (fn, weight, tokenizer) in enumerate(zip(funcs, weights, tokenizers, strict=True)):
        key = f"reward_funcs[{i}]"
        try:
            if isinstance(fn, str):
                built = build_reward(**named_reward(fn, tokenizer), weight=weight)
            elif isinstance(fn, Mapping):  # an entry of reward.functions; its own weight is reward_weights'
                built = build_reward(**{k: v for k, v in fn.items() if k != "weight"}, weight=weight)
            else:
                built = WeightedReward(reward_from_object(fn, key), weight)
        except GrpolabError:  # already names the reward and the fix
            raise
        except (ValueError, TypeError) as err:
            raise ConfigError(f"{key}: {err}") from err
        names = [r.name for r in rewards]
        if built.name in names:
            raise ConfigError(
                f"reward_funcs[{names.index(built.name)}] and {key} are both named {built.name!r} (the name they "
                "are logged under, rewards/<name>/mean): rename one function"
            )
        rewards.append(built)
    return rewards


def named_reward(name: str, tokenizer: str | None = None) -> dict[str, Any]:
    """A built-in, "module:function", or (as in TRL) a reward model's folder or hub id, with its tokenizer's."""
    if name in REWARDS or ":" in name:
        return {"name": name}
    # logged under the model's own name, as TRL names it (config._name_or_path's last part): two reward models differ
    alias = name.rstrip("/").split("/")[-1] or "reward_model"
    return {"name": "reward_model", "alias": alias, "kwargs": {"path": name, **({"tokenizer": tokenizer} if tokenizer else {})}}


def recorded_spec(fn: RewardFunc, built: WeightedReward, tokenizer: str | None = None) -> dict[str, Any]:
    """What config.yaml records for a reward given in Python."""
    if isinstance(fn, str):
        return {**named_reward(fn, tokenizer), "weight": built.weight}
    if isinstance(fn, Mapping):
        return {**fn, "weight": built.weight}
    module = getattr(fn, "__module__", None) or type(fn).__module__
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    kind = "trl" if isinstance(built.reward, TrlReward) else "auto"
    return {"name": f"{module}:{qualname}", "weight": built.weight, "kind": kind}


def as_list(reward_funcs: RewardFunc | Sequence[RewardFunc]) -> list[RewardFunc]:
    if isinstance(reward_funcs, str | Mapping) or callable(reward_funcs):
        return [reward_funcs]
    return list(reward_funcs)


def trl_reward_funcs(given: Sequence[RewardFunc], sources: Sequence[RewardFunc], rewards: Sequence[WeightedReward] | None) -> list[Any]:
    """TRL's ``trainer.reward_funcs``: what the user gave, in order, then the rewards an environment adds (``sources``
    is ``given`` with a loaded model written to a folder, then those). TRL holds each entry as given, a reward
    model's id loaded (here the model grpolab's reward loaded); a grpolab name or config entry, which TRL has not,
    is grpolab's reward object. Empty with the rewards in the config (no ``reward_funcs``: built in ``train()``)."""
    if rewards is None:
        return []
    out: list[Any] = []
    for i, (source, built) in enumerate(zip(sources, rewards, strict=True)):
        if i < len(given) and not isinstance(given[i], str | Mapping):  # a callable or a loaded model: the object
            out.append(given[i])
        elif isinstance(source, str | Mapping):
            model = getattr(built.reward, "model", None)  # a reward model (behind its alias): its loaded classifier
            out.append(model if isinstance(model, torch.nn.Module) else built.reward)
        else:
            out.append(source)  # an environment's reward: TRL's function of ``environments``
    return out
