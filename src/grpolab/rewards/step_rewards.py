"""Process rewards: one value per reasoning step (DeepSeekMath Sec. 4.1.3, arXiv 2402.03300).

A process reward has a ``name`` and a batched call ``reward(steps, examples) -> list[list[float]]``:
``steps[i]`` is completion i cut into its steps (texts, each with the delimiter that ended it, so
``"".join(steps[i])`` is the completion), and the result gives one float per step, in order. The
reward for step j may read ``steps[i][: j + 1]``, the prefix it ends. A per-step rule is written as
``fn(steps: list[str], example, **kwargs) -> list[float]`` and lifted with ``per_step``.

Where the steps come from (token ids, never re-tokenized text) is grpolab.training.reasoning_steps.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Protocol

from grpolab.config import ConfigError
from grpolab.rewards.base import RewardError, _call, describe_example, import_attr
from grpolab.types import Example

StepFn = Callable[[list[str], Example], Sequence[float]]


class ProcessReward(Protocol):
    name: str

    def __call__(self, steps: list[list[str]], examples: list[Example]) -> list[list[float]]: ...


class PerStep:
    """A per-completion rule ``fn(steps, example) -> list[float]`` seen as a batched process reward."""

    def __init__(self, fn: StepFn, name: str) -> None:
        self.fn, self.name = fn, name

    def __call__(self, steps: list[list[str]], examples: list[Example]) -> list[list[float]]:
        out = []
        for i, (row, example) in enumerate(zip(steps, examples, strict=True)):
            try:
                out.append(list(self.fn(row, example)))
            except RewardError:
                raise
            except Exception as exc:
                raise RewardError(
                    f"process reward '{self.name}' raised {type(exc).__name__} on "
                    f"{describe_example(example, i)} with steps {row!r}: {exc}. Fix the reward or the row."
                ) from exc
        return out


def per_step(fn: StepFn, *, name: str | None = None) -> PerStep:
    return PerStep(fn, name or getattr(fn, "__name__", None) or type(fn).__name__)


def _make_reward_model_steps(path: str, **kwargs: Any) -> ProcessReward:
    from grpolab.rewards.neural import RewardModelSteps  # imports transformers: only when asked for

    return RewardModelSteps(path, **kwargs)


PROCESS_REWARDS: dict[str, Callable[..., ProcessReward]] = {
    "reward_model": _make_reward_model_steps,
}


def build_process_reward(name: str, kwargs: Mapping[str, Any] | None = None) -> ProcessReward:
    """A ``PROCESS_REWARDS`` key, or ``"package.module:attribute"``: a class (instantiated with kwargs),
    a process-reward object (used as is), or a per-step rule function (kwargs bound)."""
    kwargs = dict(kwargs or {})
    if ":" not in name:
        if name not in PROCESS_REWARDS:
            raise ConfigError(
                f"unknown process reward {name!r} (reward.process.name); known: {', '.join(PROCESS_REWARDS)}, "
                "or a rule 'package.module:function' taking (steps, example)"
            )
        return PROCESS_REWARDS[name](**kwargs)
    try:
        obj = import_attr(name)
    except ValueError as err:
        raise ConfigError(f"reward.process.name: {err}") from err
    if inspect.isclass(obj):
        reward = obj(**kwargs)
        if not isinstance(getattr(reward, "name", None), str):
            reward.name = obj.__name__
        return reward
    if isinstance(getattr(obj, "name", None), str) and callable(obj):
        if kwargs:
            raise ConfigError(f"process reward {name!r} is already a reward object; it takes no kwargs")
        return obj
    if callable(obj):
        return per_step(partial(obj, **kwargs), name=getattr(obj, "__name__", name))
    raise ConfigError(f"process reward {name!r} is a {type(obj).__name__}, not a function, class or reward")


def score_steps(
    reward: ProcessReward,
    steps: Sequence[list[str]],
    examples: Sequence[Example],
    *,
    timeout_s: float | None,
) -> list[list[float]]:
    """Call ``reward`` (bounded by ``timeout_s``) and check one finite float per step, naming the example."""
    steps, examples = list(steps), list(examples)
    if len(steps) != len(examples):
        raise ValueError(
            f"{len(steps)} step lists but {len(examples)} examples; pass one example per completion"
        )
    values = _call(reward, steps, examples, timeout_s, 0)
    if not isinstance(values, Sequence) or len(values) != len(steps):
        got = len(values) if isinstance(values, Sequence) else type(values).__name__
        raise RewardError(
            f"process reward '{reward.name}' returned {got} rows for {len(steps)} completions; "
            "return one list of step rewards per completion"
        )
    return [
        _checked_row(reward.name, row, s, e, i)
        for i, (row, s, e) in enumerate(zip(values, steps, examples, strict=True))
    ]


def _checked_row(name: str, row: object, steps: list[str], example: Example, index: int) -> list[float]:
    where = describe_example(example, index)
    if isinstance(row, str | bytes) or not isinstance(row, Sequence) or len(row) != len(steps):
        raise RewardError(
            f"process reward '{name}' returned {row!r} for {where}, which has {len(steps)} steps {steps!r}; "
            "return exactly one float per step"
        )
    for value in row:
        if not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise RewardError(
                f"process reward '{name}' returned {value!r} for a step of {where}; return finite floats"
            )
    return [float(v) for v in row]
