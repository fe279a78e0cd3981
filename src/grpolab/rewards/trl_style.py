"""Reward functions written for TRL's GRPOTrainer, used unchanged.

A TRL reward function is ``fn(completions, **kwargs) -> list[float | None]``, called once per batch
with keyword lists of one entry per completion: ``prompts``, ``completions``, ``completion_ids``
and every dataset column (TRL leaves out the columns named prompt, completion and completion_ids).
For a conversational example (prompt given as chat messages) the prompt is the message list and the
completion is ``[{"role": "assistant", "content": text}]``; otherwise both are strings.

Where this departs from TRL, and why:

* TRL also passes ``trainer_state``, ``log_extra`` and ``log_metric``; so does grpolab in a run
  (rewards/trl_hooks.py, attached by runtime/assemble.py), with these differences: ``trainer_state``
  is a ``RewardTrainerState`` (``global_step``: the steps done, ``max_steps``: train.num_steps, both
  in grpolab steps of one generation batch; TRL counts optimizer steps) rather than transformers'
  TrainerState; ``log_metric`` values are averaged over the step and logged under their name in
  metrics.jsonl (a name grpolab already logs gets ``log_metric/`` in front); ``log_extra`` columns
  join the step's rows of samples.jsonl when they hold one value per completion. Outside a run
  (a reward called on its own) none of them is passed, so a function that requires one fails
  with a message saying so.
* In a run with ``environment_factory`` TRL passes ``environments`` to every reward function: each completion's
  environment object, in completion order, after its episode ended (``Episode.environment``). So does grpolab, to
  a function that names ``environments`` or takes ``**kwargs``; the objects live in the trainer process, so such a
  function runs there (``in_process``: ``reward.timeout_s`` then interrupts it in the main thread rather than
  killing a worker process). Elsewhere (no environment_factory, a reward called alone, ``grpolab eval``, the single
  turns ``GRPOTrainer.evaluate`` samples) it is not passed, as in TRL without environments; a function that
  requires it fails with one line saying so.
* A function without ``**kwargs`` receives only the arguments it names, rather than failing on
  the first dataset column it does not expect.
* Synchronous functions run in the main thread, as in TRL (the math-verify accuracy reward of TRL's
  docs uses signal.alarm, which only works there); ``reward.timeout_s`` interrupts them there.
* In the dry run before training, completions are reference answers given as text: their
  ``completion_ids`` are empty lists.
* A dataset column named ``prompts``, ``completions`` or ``completion_ids`` is refused (TRL fails on it
  with "got multiple values for keyword argument"): the reward would get the model's completions,
  not the column, and score against the wrong thing without a word. Rename the column
  (``check_columns``; the Python API checks it when the trainer is made, the command line in the dry run).

``async def`` functions are awaited together with every other async reward of the batch
(``asyncio.gather`` in ``score_batch``), as TRL does, so slow remote judges overlap.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from grpolab.rewards.base import RewardError
from grpolab.rewards.trl_hooks import CallLog, Logged, StepCell, TrlHooks
from grpolab.types import Completion, Example

TRL_ARGUMENTS = ("prompts", "completions", "completion_ids")
_LEFT_OUT_COLUMNS = ("prompt", "completion", "completion_ids")  # TRL's list, so columns line up
_TRL_ONLY = ("trainer_state", "log_extra", "log_metric", "environments")


def looks_like_trl(fn: Callable[..., Any]) -> bool:
    """True when ``fn`` names one of TRL's batch arguments (``completions``, ``prompts``, ``completion_ids``,
    ``environments``: TRL's ``def reward(environments, **kwargs)`` reads only the environments).

    grpolab's own per-sample functions take ``(completion, example)``, so the plural names tell them apart.
    """
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    native = "example" in params or "examples" in params  # grpolab's (completions, examples) call
    return not native and any(name in params for name in (*TRL_ARGUMENTS, "environments"))


def _is_async(fn: Callable[..., Any]) -> bool:
    target = fn.func if isinstance(fn, partial) else fn
    call = target if inspect.isroutine(target) else type(target).__call__  # a callable object
    return inspect.iscoroutinefunction(call)


class TrlReward:
    """A TRL reward function seen as a grpolab batched reward ``(completions, examples) -> values``."""

    def __init__(
        self, fn: Callable[..., Any], name: str | None = None, kwargs: Mapping[str, Any] | None = None
    ):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or type(fn).__name__
        self.kwargs = dict(kwargs or {})
        self.is_async = _is_async(fn)
        self.step_cell = StepCell()  # made now, before any worker forks: it then reads each write
        self.hooks: TrlHooks | None = None
        """The run this reward logs into (``attach_hooks``, in the trainer); None outside a run."""
        self.main_thread = not self.is_async  # as in TRL; math-verify's signal.alarm needs it (base.py)
        params = inspect.signature(fn).parameters.values()
        self._takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        self._named = {p.name for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD}
        self._required = {
            p.name
            for p in params
            if p.default is inspect.Parameter.empty
            and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        }
        unknown = set(self.kwargs) - self._named
        if unknown and not self._takes_any:
            raise ValueError(
                f"reward {self.name!r} does not accept kwargs {sorted(unknown)}; its parameters are {sorted(self._named)}"
            )

    @property
    def in_process(self) -> bool:
        """True when the function gets ``environments``: the objects exist only in the trainer process."""
        return self._gets_environments()

    def _gets_environments(self) -> bool:
        """TRL's rule: every reward gets ``environments`` in a run with environment_factory (module docstring)."""
        named = "environments" in self._named or self._takes_any
        return named and self.hooks is not None and self.hooks.environments

    def attach_hooks(self, hooks: TrlHooks) -> None:
        """Pass ``trainer_state``, ``log_metric`` and ``log_extra`` from now on, for ``hooks``' run."""
        self.hooks = hooks
        hooks.attach(self.step_cell)

    def received(self, values: Any) -> Any:
        """A call's values as it returned them, wherever it ran; what the function logged goes to the run."""
        if not isinstance(values, Logged):
            return values
        if self.hooks is not None:
            self.hooks.merge(values)
        return values.values

    def arguments(
        self, completions: list[Completion], examples: list[Example], call_log: CallLog | None = None
    ) -> dict[str, Any]:
        """The keyword lists TRL would pass for this batch (one entry per completion); in a run also
        ``trainer_state`` and the ``log_*`` functions, which log into ``call_log``."""
        state = self.step_cell.read()
        columns = [_columns(e) for e in examples]
        names = list(dict.fromkeys(k for c in columns for k in c))
        check_columns(names, "the dataset")
        args: dict[str, Any] = {
            "prompts": [list(e.messages) if e.messages is not None else e.prompt for e in examples],
            "completions": [
                [{"role": "assistant", "content": c.text}] if e.messages is not None else c.text
                for c, e in zip(completions, examples, strict=True)
            ],
            "completion_ids": [list(c.token_ids or ()) for c in completions],
            **{k: [c.get(k) for c in columns] for k in names if k not in TRL_ARGUMENTS},
            **(call_log.kwargs(state) if call_log is not None and state is not None else {}),
            **self.kwargs,
        }
        environments = self._environments(completions) if self._gets_environments() else None
        if environments is not None:
            args["environments"] = environments
        missing = sorted(self._required - set(args))
        if missing:
            trl_only = [m for m in missing if m in _TRL_ONLY]
            hint = (
                "environments (each completion's environment_factory object) are passed only for the episodes of "
                "a training run with environment_factory; give the parameter a default"
                if "environments" in missing
                else f"{trl_only} are passed only inside a training run; give them a default"
                if trl_only
                else "add those columns to the dataset rows, or give the parameters defaults"
            )
            raise RewardError(
                f"reward {self.name!r} needs {missing}, but the batch has only "
                f"{sorted(set(args))} (dataset columns and TRL's prompts/completions/completion_ids); {hint}"
            )
        return args if self._takes_any else {k: v for k, v in args.items() if k in self._named}

    def _environments(self, completions: list[Completion]) -> list[Any] | None:
        """Each completion's environment object (``Episode.environment``), in order; None when no completion is an
        episode with one (``GRPOTrainer.evaluate`` samples single turns); some with and some without is an error."""
        found = [c.episode.environment if c.episode is not None else None for c in completions]
        if all(e is None for e in found):
            return None
        if None in found:
            raise RewardError(
                f"reward {self.name!r} reads environments, but completion {found.index(None)} of the batch has no "
                "environment object (it was not sampled as an environment_factory episode)"
            )
        return found

    def __call__(self, completions: list[Completion], examples: list[Example]) -> Any:
        """The values, or in a run what the function logged with them (``Logged``; see ``received``)."""
        if self.is_async:  # alone (the dry run, a caller without a loop): run it in its own loop
            return asyncio.run(self.acall(completions, examples))
        call_log = CallLog()
        return call_log.wrap(self.fn(**self.arguments(completions, examples, call_log)))

    async def acall(self, completions: list[Completion], examples: list[Example]) -> Any:
        call_log = CallLog()
        result = self.fn(**self.arguments(completions, examples, call_log))
        return call_log.wrap(await result if inspect.isawaitable(result) else result)

    def __repr__(self) -> str:
        return f"TrlReward({self.name!r}{', async' if self.is_async else ''})"


def check_columns(columns: Sequence[str], where: str) -> None:
    """RewardError when a dataset column has the name of one of TRL's batch arguments (module docstring)."""
    clash = [c for c in TRL_ARGUMENTS if c in columns]
    if clash:
        raise RewardError(
            f"{where} has a column named {clash[0]!r}, the name of the argument through which a TRL-style reward "
            f"gets the model's {clash[0].replace('_', ' ')}: the column would be replaced without a word. Rename "
            f"the column (e.g. reference_{clash[0]}) and the reward's parameter with it"
        )


def _columns(example: Example) -> dict[str, Any]:
    """Every column of the example's dataset row; task examples offer their answer and meta fields."""
    row = example.meta.get("row")
    if isinstance(row, Mapping):
        return {k: v for k, v in row.items() if k not in _LEFT_OUT_COLUMNS}
    extra = {k: v for k, v in example.meta.items() if k not in _LEFT_OUT_COLUMNS}
    return {"answer": example.answer, **extra}
