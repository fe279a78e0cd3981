"""Rewards: the contract (base), rule rewards, and the registry that builds them from a config.

``build_reward(name, weight=, kwargs=)`` takes either a ``REWARDS`` key, whose factory is called
with ``kwargs``, or ``"package.module:attribute"`` naming one of:

* a class: instantiated with ``kwargs``; the instance must have a str ``name`` (else the class
  name is used) and a batched call ``(completions, examples) -> list[float | None]``;
* a reward object (anything with a str ``name`` and that batched call, e.g. a function decorated
  with ``@per_sample``): used as is, so ``kwargs`` must be empty;
* a plain function ``fn(completion, example, **kwargs) -> float | None``: a per-sample reward,
  named after the function, with ``kwargs`` bound as keyword arguments;
* a TRL reward function ``fn(completions, **kwargs) -> list[float | None]`` (told apart by its
  parameter names ``completions`` / ``prompts`` / ``completion_ids``, or by ``kind="trl"``), called
  as TRL's GRPOTrainer calls it (rewards.trl_style), ``async def`` ones awaited concurrently.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from grpolab.config import RewardSpec
from grpolab.errors import ConfigError, GrpolabError
from grpolab.rewards import rules
from grpolab.rewards.base import (
    PerSample,
    Reward,
    RewardError,
    SampleError,
    ScoreResult,
    WeightedReward,
    dry_run,
    import_attr,
    per_sample,
    score_batch,
)
from grpolab.rewards.code import make_code_tests
from grpolab.rewards.judge import make_group_judge, make_judge
from grpolab.rewards.math_answer import make_math_accuracy
from grpolab.rewards.reasoning_gym import make_gym_score
from grpolab.rewards.trl_style import TrlReward, looks_like_trl
from grpolab.rewards.worker import start_workers


def _make_reward_model(
    path: str,
    batch_size: int = 16,
    max_length: int = 1024,
    autocast: str = "auto",
    device: str = "auto",
    name: str = "reward_model",
    tokenizer: str | None = None,
) -> Reward:
    """A neural reward model (AutoModelForSequenceClassification, one output); see rewards.neural."""
    from grpolab.rewards.neural import RewardModel  # imports transformers: only when asked for

    return RewardModel(
        path, batch_size=batch_size, max_length=max_length, autocast=autocast, device=device, name=name,
        tokenizer=tokenizer,
    )


def _make_env_reward() -> Reward:
    """The environment's episode reward (per-turn rewards summed; None when it gave none)."""

    def env(completion, example) -> float | None:
        return None if completion.episode is None else completion.episode.env_reward

    return per_sample(env, name="env")


REWARDS: dict[str, Callable[..., Reward]] = {
    "env": _make_env_reward,
    "exact_match": rules.make_exact_match,
    "answer_anywhere": rules.make_answer_anywhere,
    "math_accuracy": make_math_accuracy,
    "r1_format": rules.make_r1_format,
    "soft_overlong": rules.make_soft_overlong,
    "length_penalty": rules.make_length_penalty,
    "truncation_penalty": rules.make_truncation_penalty,
    "reasoning_gym": make_gym_score,
    "reward_model": _make_reward_model,
    "code_tests": make_code_tests,
    "judge": make_judge,
    "group_judge": make_group_judge,
}


IN_PROCESS = frozenset(
    {"exact_match", "answer_anywhere", "r1_format", "soft_overlong", "length_penalty", "truncation_penalty", "code_tests", "reward_model",
     "judge", "group_judge"}
)
"""REWARDS that run in the trainer even with a timeout (rewards.timeouts): grpolab's rule rewards are short string
code whose regexes run in linear time, code_tests kills its own sandboxes, the reward model needs the trainer's
device, a judge bounds its own requests. The others (math_accuracy, reasoning_gym: third-party parsers of the completion's text) and every user
reward run in a worker process that is killed when reward.timeout_s is up (rewards.worker)."""


def _check_kwargs(label: str, fn: Callable[..., Any], kwargs: Mapping[str, Any], *args: Any) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have none; the call itself will complain
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise ValueError(
            f"reward {label!r} does not accept kwargs {dict(kwargs)} ({exc}); its signature is {signature}"
        ) from exc


def _call_factory(label: str, factory: Callable[..., Any], kwargs: Mapping[str, Any]) -> Any:
    _check_kwargs(label, factory, kwargs)
    return factory(**kwargs)


def _user_reward(spec: str, kwargs: Mapping[str, Any], kind: str = "auto") -> Reward:
    return reward_from_object(import_attr(spec), spec, kwargs, kind)


def reward_from_object(obj: Any, spec: str, kwargs: Mapping[str, Any] | None = None, kind: str = "auto") -> Reward:
    """A reward from a Python object (see the module docstring): a TRL function, a class, a reward object or a
    per-sample function. ``spec`` names it in errors (and names a class instance without a ``name``)."""
    kwargs = dict(kwargs or {})
    if kind == "trl" or (kind == "auto" and not inspect.isclass(obj) and _trl_function(obj)):
        if not callable(obj) or inspect.isclass(obj):
            raise ValueError(f"reward {spec!r} (kind: trl) must be a function fn(completions, **kwargs)")
        return TrlReward(obj, name=getattr(obj, "__name__", None), kwargs=kwargs)
    if inspect.isclass(obj):
        reward = _call_factory(spec, obj, kwargs)
        if not isinstance(getattr(reward, "name", None), str):
            reward.name = obj.__name__
        return reward
    if isinstance(getattr(obj, "name", None), str) and callable(obj):
        if kwargs:
            raise ValueError(
                f"reward {spec!r} is already a reward object; it takes no kwargs, got {dict(kwargs)}"
            )
        return obj
    if callable(obj):
        _check_kwargs(spec, obj, kwargs, None, None)
        return per_sample(partial(obj, **kwargs), name=getattr(obj, "__name__", spec))
    raise ValueError(f"reward {spec!r} is a {type(obj).__name__}, not a function, class or reward object")


def _trl_function(obj: Any) -> bool:
    """A TRL reward function, not a grpolab reward object (which has a str ``name``)."""
    return callable(obj) and not isinstance(getattr(obj, "name", None), str) and looks_like_trl(obj)


class Aliased:
    """A reward under another name (RewardSpec.alias): logged and combined as ``name``."""

    def __init__(self, reward: Reward, name: str) -> None:
        self.reward, self.name = reward, name

    def __call__(self, completions, examples):
        return self.reward(completions, examples)

    def __getattr__(self, attr: str) -> Any:  # num_parameters, modules: as the wrapped reward
        if attr == "reward":
            raise AttributeError(attr)
        return getattr(self.reward, attr)


def build_reward(
    name: str,
    *,
    weight: float = 1.0,
    kwargs: Mapping[str, Any] | None = None,
    kind: str = "auto",
    alias: str | None = None,
) -> WeightedReward:
    """A ``REWARDS`` key or ``"package.module:attribute"`` (see the module docstring), with its weight.

    ``kind``: "auto" tells a TRL function by its parameter names, "trl" insists on one, "native"
    takes a plain function as ``fn(completion, example)``. ``alias`` renames it (two entries of one
    reward with different kwargs).
    """
    if alias is not None:
        inner = build_reward(name, weight=weight, kwargs=kwargs, kind=kind)
        return WeightedReward(Aliased(inner.reward, alias), weight)
    kwargs = dict(kwargs or {})
    if kind not in ("auto", "native", "trl"):
        raise ValueError(f"reward kind {kind!r} is not one of 'auto', 'native', 'trl'")
    if ":" in name:
        return WeightedReward(_user_reward(name, kwargs, kind), weight)
    if kind == "trl":
        raise ValueError(
            f"reward {name!r} has kind: trl, which needs a function given as 'package.module:function'"
        )
    if name not in REWARDS:
        close = difflib.get_close_matches(name, REWARDS, n=3)
        hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
        raise ValueError(
            f"unknown reward {name!r}; {hint}known rewards: {', '.join(REWARDS)}; "
            "or give your own as 'package.module:function'"
        )
    reward = _call_factory(name, REWARDS[name], kwargs)
    if name in IN_PROCESS:
        reward.in_process = True
    return WeightedReward(reward, weight)


def build_rewards(specs: Sequence[RewardSpec], key: str = "reward.functions") -> list[WeightedReward]:
    """The rewards of ``specs``, the config's entries under ``key`` (reward.functions); a bad entry is a
    ConfigError naming ``key[i]``; two entries of the same name (they would overwrite each other's logged
    component) are an error pointing at ``alias``."""
    if not specs:
        raise ConfigError(
            f"{key} is empty: name at least one reward, e.g. {key}=[{{name: math_accuracy}}]"
        )
    rewards: list[WeightedReward] = []
    for i, spec in enumerate(specs):
        try:
            built = build_reward(
                spec.name, weight=spec.weight, kwargs=spec.kwargs, alias=spec.alias, kind=spec.kind
            )
        except GrpolabError:
            raise
        except (ValueError, TypeError) as err:
            raise ConfigError(f"{key}[{i}] (name {spec.name!r}): {err}") from err
        names = [r.name for r in rewards]
        if built.name in names:
            raise ConfigError(
                f"{key}[{names.index(built.name)}] and {key}[{i}] are both named {built.name!r}; "
                f"give one an alias, e.g. {key}[{i}].alias={built.name}_2"
            )
        rewards.append(built)
    return rewards


__all__ = [
    "IN_PROCESS",
    "REWARDS",
    "PerSample",
    "Reward",
    "RewardError",
    "SampleError",
    "ScoreResult",
    "TrlReward",
    "WeightedReward",
    "build_reward",
    "build_rewards",
    "dry_run",
    "per_sample",
    "reward_from_object",
    "score_batch",
    "start_workers",
]
