"""The reward contract, and the one function that scores a batch and checks every value.

A reward is an object with a ``name`` and a batched call
``reward(completions, examples) -> list[float | None]``: one value per completion, in order, where
``examples[i]`` is the example that ``completions[i]`` answers (the trainer repeats each prompt's
example G times). ``None`` means "does not apply"; the trainer gives that sample zero advantage.
Rewards know nothing of tensors or models.

A reward may also be asynchronous: ``is_async = True`` and ``async acall(completions, examples)``
(TRL-style ``async def`` functions, rewards.trl_style). ``score_batch`` awaits all of a batch's async
rewards together with ``asyncio.gather`` under one ``timeout_s``, then runs the others in turn.

Each call is bounded by ``timeout_s`` (grpolab.rewards.timeouts): with a timeout a reward runs in a
worker process killed at the deadline (grpolab.rewards.worker), unless it sets ``in_process = True``.
A reward that bounds each of its own items (code_tests kills each program at its own timeout_s and
scores it 0) says how long a whole batch may take, ``time_budget_s(completions, examples)``; its call
is then bounded by the larger of that and ``timeout_s``, so slow items never stop the run, only a
reward that hangs as a whole. An in-process reward may also leave ``counts`` (``{key: number}``) after
each call; they are summed over the step and logged as ``rewards/<name>/<key>``.

``score_batch`` raises the first failure as a RewardError (its subclass says the kind: rewards.errors). Training
scores whole groups through rewards.isolate, which retries a failed call group by group and keeps a failure to
the groups it hit (docs/training.md, "Failed samples").
"""

from __future__ import annotations

import difflib
import importlib
import math
import numbers
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol, runtime_checkable

from grpolab.errors import ConfigError, RewardError
from grpolab.rewards.errors import (
    RewardMalformed,
    RewardNotFinite,
    RewardServiceDown,
    RewardTimedOut,
    SampleError,
    describe_example,
)
from grpolab.rewards.timeouts import TimedOut, Unsendable, call_bounded, gather_bounded
from grpolab.rewards.worker import WorkerDied
from grpolab.types import Completion, Example, Failure

SampleFn = Callable[[Completion, Example], "float | None"]


@runtime_checkable
class Reward(Protocol):
    name: str

    def __call__(self, completions: list[Completion], examples: list[Example]) -> list[float | None]: ...


class PerSample:
    """A per-sample function ``fn(completion, example) -> float | None`` seen as a batched reward."""

    def __init__(self, fn: SampleFn, name: str | None = None) -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or type(fn).__name__

    def __call__(self, completions: list[Completion], examples: list[Example]) -> list[float | None]:
        out: list[float | None] = []
        for i, (completion, example) in enumerate(zip(completions, examples, strict=True)):
            try:
                out.append(self.fn(completion, example))
            except RewardError:
                raise
            except Exception as exc:
                raise SampleError(self.name, i, example, exc) from exc
        return out

    def __repr__(self) -> str:
        return f"PerSample({self.name!r})"


def per_sample(fn: SampleFn | None = None, *, name: str | None = None):
    """Lift ``fn(completion, example) -> float | None`` to a batched reward.

    Use as ``per_sample(fn)``, ``per_sample(fn, name="x")``, ``@per_sample`` or ``@per_sample(name="x")``.
    """
    if fn is None:
        return lambda f: PerSample(f, name)
    return PerSample(fn, name)


def _as_float(value: numbers.Real) -> float:
    """float(value), or inf for an int beyond float's range."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


@dataclass(frozen=True)
class WeightedReward:
    reward: Reward
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.weight, numbers.Real) or not math.isfinite(_as_float(self.weight)):
            raise ConfigError(
                f"reward '{getattr(self.reward, 'name', self.reward)}' has weight {self.weight!r}; give a finite number"
            )
        if not callable(self.reward) or not isinstance(getattr(self.reward, "name", None), str):
            raise ValueError(
                f"{self.reward!r} is not a reward: it needs a str `name` and a batched call "
                "(completions, examples) -> list[float | None]; wrap a per-sample function with per_sample()"
            )

    @property
    def name(self) -> str:
        return self.reward.name


@dataclass(frozen=True)
class ScoreResult:
    total: list[float | None]
    """[N] weighted sum of the components that apply; None only where no component applies."""
    components: dict[str, list[float | None]]
    """Per reward name, [N] unweighted values, for logging."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Per reward name, wall-clock seconds of its call."""
    counts: dict[str, float] = field(default_factory=dict)
    """``rewards/<name>/<key>``: the ``counts`` rewards left after their call (e.g. code_tests' timed_out)."""
    failures: list[Failure | None] | None = None
    """[N] why each row failed (its group's failure, rewards.isolate), None where it did not; None = no row
    failed. A failed row has no total and no component: it is never scored 0."""
    retries: int = 0
    """Reward calls made again on one group alone after a call failed (reward.max_retries)."""


def _call(reward: Reward, completions: list, examples: list, timeout_s: float | None, first_index: int):
    """``reward(completions, examples)`` within ``timeout_s`` (rewards.timeouts), failures as RewardError."""
    label = f"'{reward.name}'"
    budget = getattr(reward, "time_budget_s", None)
    if timeout_s is not None and callable(budget):  # it bounds its items itself: only a hang as a whole stops
        timeout_s = max(timeout_s, float(budget(completions, examples)))
    try:
        return call_bounded(reward, (completions, examples), timeout_s)
    except (TimedOut, WorkerDied, Unsendable) as err:
        raise _bound_error(err, label, examples, timeout_s, first_index) from None


def _bound_error(err: Exception, label: str, examples: list, timeout_s, first_index: int) -> RewardError:
    where = f"a batch of {len(examples)} completions (first {describe_example(examples[0], first_index)})"
    if isinstance(err, TimedOut):
        return RewardTimedOut(
            f"reward {label} took longer than {timeout_s:g} s on {where}; raise reward.timeout_s or make it faster"
        )
    if isinstance(err, WorkerDied):
        return RewardError(
            f"reward {label} ended its worker process ({err}) on {where}; a reward must return its values, "
            "not exit or crash"
        )
    return RewardError(
        f"reward {label}: the batch cannot be sent to the reward's worker process ({err}); keep the examples' "
        "meta to plain data, or set in_process = True on the reward"
    )


def _checked_values(name: str, values: object, examples: Sequence[Example], first_index: int) -> list:
    if isinstance(values, str | bytes | Mapping) or not hasattr(values, "__len__"):
        raise RewardMalformed(
            f"reward '{name}' returned {type(values).__name__}; a batched reward must return a list "
            f"with one float (or None) per completion"
        )
    values = list(values)  # type: ignore[call-overload]
    if len(values) != len(examples):
        raise RewardMalformed(
            f"reward '{name}' returned {len(values)} values for {len(examples)} completions; it must "
            "return exactly one value (or None) per completion, in order"
        )
    out: list[float | None] = []
    for i, value in enumerate(values):
        if value is None:
            out.append(None)
            continue
        where = describe_example(examples[i], first_index + i)
        if not isinstance(value, numbers.Real):
            raise RewardMalformed(
                f"reward '{name}' returned {value!r} ({type(value).__name__}) for {where}; "
                "return a float, or None when the reward does not apply"
            )
        number = _as_float(value)  # an int beyond float's range (about 1.8e308) is inf
        if not math.isfinite(number):
            shown = repr(value) if len(repr(value)) <= 40 else f"an int of {len(str(abs(value)))} digits"
            raise RewardNotFinite(
                f"reward '{name}' returned {shown} for {where}; return a finite float "
                "(guard divisions and logs), or None when the reward does not apply"
            )
        out.append(number)
    return out


def _score_one(
    wr: WeightedReward, completions: list, examples: list, timeout_s: float | None, first_index: int = 0
) -> list[float | None]:
    if not completions:
        return []
    try:
        values = _call(wr.reward, completions, examples, timeout_s, first_index)
    except SystemExit as exc:  # sys.exit() in a reward would end the run with no message
        raise RewardError(
            f"reward '{wr.name}' called sys.exit({exc.code!r}) on {describe_example(examples[0], first_index)}; "
            "a reward must return a value (or None), never exit the process"
        ) from exc
    except Exception as exc:
        _raise_failure(wr, exc, examples, first_index)
    return _checked_values(wr.name, _received(wr, values), examples, first_index)


def _received(wr: WeightedReward, values: object) -> object:
    """What the reward object in the trainer makes of a call's return value, wherever the call ran (a TRL
    reward takes back what its function logged: rewards/trl_hooks.py); most rewards have no ``received``."""
    received = getattr(wr.reward, "received", None)
    return received(values) if callable(received) else values


def _raise_failure(wr: WeightedReward, exc: Exception, examples: list, first_index: int) -> NoReturn:
    """Re-raise ``exc``, raised by ``wr`` on ``examples``, as a RewardError naming the example (a service that is
    down stops the run as it is: rewards.errors.RewardServiceDown)."""
    if isinstance(exc, RewardServiceDown):
        raise exc
    if isinstance(exc, SampleError):
        if first_index == 0:
            raise exc
        raise SampleError(exc.name, exc.index + first_index, exc.example, exc.exc) from exc.exc
    if isinstance(exc, RewardError):
        raise exc
    where = (
        describe_example(examples[0], first_index)
        if len(examples) == 1
        else (f"a batch of {len(examples)} (first {describe_example(examples[0], first_index)})")
    )
    raise RewardError(
        f"reward '{wr.name}' raised {type(exc).__name__} on {where}: {exc}. Fix the reward; "
        "run grpolab.rewards.dry_run to find the exact example"
    ) from exc


def _is_async(wr: WeightedReward) -> bool:
    return bool(getattr(wr.reward, "is_async", False)) and hasattr(wr.reward, "acall")


def _score_async(
    rewards: Sequence[WeightedReward], completions: list, examples: list, timeout_s: float | None, first_index: int = 0
) -> dict[str, list[float | None]]:
    """Await every async reward together (asyncio.gather, in a fresh loop), each result then checked."""
    label = "+".join(f"'{wr.name}'" for wr in rewards) + " (async, awaited together)"
    try:
        results = gather_bounded([wr.reward for wr in rewards], (completions, examples), timeout_s)
    except (TimedOut, WorkerDied, Unsendable) as err:
        raise _bound_error(err, label, examples, timeout_s, first_index) from None
    out = {}
    for wr, values in zip(rewards, results, strict=True):
        if isinstance(values, BaseException):
            if not isinstance(values, Exception):
                raise values
            _raise_failure(wr, values, examples, first_index)
        out[wr.name] = _checked_values(wr.name, _received(wr, values), examples, first_index)
    return out


def merge_scores(parts: Sequence[ScoreResult]) -> ScoreResult:
    """The scores of consecutive parts of one batch (groups scored as they finished) as the batch's: values and
    failures concatenated in order, seconds, counts and retries summed."""
    names = list(parts[0].components) if parts else []
    seconds: dict[str, float] = {}
    counts: dict[str, float] = {}
    for part in parts:
        for k, v in part.seconds.items():
            seconds[k] = seconds.get(k, 0.0) + v
        for k, v in part.counts.items():
            counts[k] = counts.get(k, 0.0) + v
    failed = any(part.failures is not None for part in parts)
    return ScoreResult(
        total=[t for part in parts for t in part.total],
        components={n: [v for part in parts for v in part.components[n]] for n in names},
        seconds=seconds,
        counts=counts,
        failures=[f for part in parts for f in part.failures or [None] * len(part.total)] if failed else None,
        retries=sum(part.retries for part in parts),
    )


def _check_inputs(rewards: Sequence[WeightedReward], completions: Sequence, examples: Sequence) -> None:
    if len(completions) != len(examples):
        raise ValueError(
            f"{len(completions)} completions but {len(examples)} examples; pass one example per "
            "completion (repeat each prompt's example G times)"
        )
    names = [wr.name for wr in rewards]
    for name in names:
        if names.count(name) > 1:
            raise ValueError(
                f"two rewards are named '{name}'; give each a distinct name (reward.functions[i].alias)"
            )


def score_batch(
    rewards: Sequence[WeightedReward],
    completions: Sequence[Completion],
    examples: Sequence[Example],
    *,
    timeout_s: float | None,
    first_index: int = 0,
) -> ScoreResult:
    """Score N completions with every reward; each call is checked and bounded by ``timeout_s``.
    ``first_index``: the index of ``completions[0]`` in its step, for error messages (a group scored alone)."""
    _check_inputs(rewards, completions, examples)
    completions, examples = list(completions), list(examples)
    components: dict[str, list[float | None]] = {}
    seconds: dict[str, float] = {}
    counts: dict[str, float] = {}
    concurrent = [wr for wr in rewards if _is_async(wr)]
    if concurrent and completions:
        start = time.perf_counter()
        components.update(_score_async(concurrent, completions, examples, timeout_s, first_index))
        seconds.update(dict.fromkeys(components, time.perf_counter() - start))
    for wr in rewards:
        if wr.name in components:
            continue
        start = time.perf_counter()
        components[wr.name] = _score_one(wr, completions, examples, timeout_s, first_index)
        seconds[wr.name] = time.perf_counter() - start
        if completions and isinstance(getattr(wr.reward, "counts", None), Mapping):
            counts.update({f"rewards/{wr.name}/{k}": float(v) for k, v in wr.reward.counts.items()})
    components = {wr.name: components[wr.name] for wr in rewards}  # in the configured order
    total = [_total(rewards, components, i, examples[i]) for i in range(len(completions))]
    return ScoreResult(total=total, components=components, seconds=seconds, counts=counts)


def _total(rewards: Sequence[WeightedReward], components: dict, i: int, example: Example) -> float | None:
    """The weighted sum of completion ``i``'s components; one that is not finite (1e308 x 10) is an error."""
    parts = [(wr, v) for wr in rewards if (v := components[wr.name][i]) is not None]
    if not parts:
        return None
    total = sum(wr.weight * v for wr, v in parts)
    if not math.isfinite(total):
        terms = " + ".join(f"{wr.weight:g} x {v:g} ('{wr.name}')" for wr, v in parts)
        raise RewardNotFinite(
            f"the total reward of {describe_example(example, i)} is {total} ({terms}): a weight or a reward "
            "value is too large; scale the reward (return values near [-1, 1]) or lower its weight"
        )
    return total


def dry_run(
    rewards: Sequence[WeightedReward],
    completions: Sequence[Completion],
    examples: Sequence[Example],
    *,
    timeout_s: float | None,
    max_examples: int = 4,
) -> dict[str, float]:
    """Run each reward one example at a time on the first ``max_examples``, before training.

    Raises the first failure with the exact example named. Returns seconds per sample, per reward.
    """
    _check_inputs(rewards, completions, examples)
    count = min(max_examples, len(completions))
    per_sample_s: dict[str, float] = {}
    values: dict[str, list[float | None]] = {}
    for wr in rewards:
        start = time.perf_counter()
        values[wr.name] = [_score_one(wr, [completions[j]], [examples[j]], timeout_s, first_index=j)[0]
                           for j in range(count)]
        per_sample_s[wr.name] = (time.perf_counter() - start) / max(count, 1)
    for j in range(count):  # the weighted totals too: 1e308 x weight 10 is inf
        _total(rewards, values, j, examples[j])
    return per_sample_s


def import_attr(spec: str) -> Any:
    """The object named by ``"package.module:attribute"``; a ValueError says what is wrong with the spec."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"reward {spec!r}: write a user reward as 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ValueError(
            f"reward {spec!r}: cannot import module {module_name!r} ({exc}); put it beside the config file, "
            "install it, or put its folder on PYTHONPATH"
        ) from exc
    if not hasattr(module, attr):
        public = [n for n in dir(module) if not n.startswith("_")]
        close = difflib.get_close_matches(attr, public, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"reward {spec!r}: module {module_name!r} has no attribute {attr!r}{hint}")
    return getattr(module, attr)
