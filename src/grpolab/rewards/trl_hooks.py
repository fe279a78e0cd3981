"""TRL's extra reward arguments in a run: ``trainer_state``, ``log_metric`` and ``log_extra`` (and whether the run
has TRL's ``environments``: ``TrlHooks.environments``; those objects never leave the trainer, rewards/trl_style.py).

A TRL reward usually runs in a worker process forked from the trainer (rewards/worker.py), which keeps
a copy of the reward made at the fork, so neither direction can go through the reward object:

* the run's progress reaches the reward through a few bytes of memory shared with every later fork
  (``StepCell``, one per reward, made with it), written by the trainer before each step;
* what the function logs during one call is gathered by that call (``CallLog``) and travels back with
  its values (``Logged``); the reward object in the trainer hands it to the run's ``TrlHooks``
  (``received``, called by rewards/base.py wherever the reward ran), and the loop takes it per step.
"""

from __future__ import annotations

import mmap
import struct
import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

_CELL = struct.Struct("qq")  # max_steps, global_step


@dataclass(frozen=True)
class RewardTrainerState:
    """What a TRL reward reads from ``trainer_state``: how far the run is (a reward's curriculum)."""

    global_step: int
    """Steps done before the one being scored (grpolab steps: one generation batch each)."""
    max_steps: int
    """The run's length, train.num_steps."""


class StepCell:
    """The run's progress in memory shared with the reward's worker process; no run: ``read()`` is None."""

    def __init__(self) -> None:
        self._memory = mmap.mmap(-1, _CELL.size)  # anonymous and shared: a fork made later sees each write

    def write(self, state: RewardTrainerState | None) -> None:
        _CELL.pack_into(self._memory, 0, *((state.max_steps, state.global_step) if state else (0, 0)))

    def read(self) -> RewardTrainerState | None:
        max_steps, global_step = _CELL.unpack_from(self._memory, 0)
        return RewardTrainerState(global_step=global_step, max_steps=max_steps) if max_steps > 0 else None


@dataclass
class CallLog:
    """What one call of the function logged through ``log_metric`` and ``log_extra``."""

    metrics: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    extra: dict[str, list[Any]] = field(default_factory=lambda: defaultdict(list))

    def log_metric(self, name: str, value: float) -> None:
        """TRL's ``log_metric``: a scalar, averaged over the step's calls."""
        self.metrics[name].append(float(value))

    def log_extra(self, column: str, values: list) -> None:
        """TRL's ``log_extra``: a column of the step's sample table, one value per completion."""
        self.extra[column].extend(values)

    def kwargs(self, state: RewardTrainerState) -> dict[str, Any]:
        return {"trainer_state": state, "log_extra": self.log_extra, "log_metric": self.log_metric}

    def wrap(self, values: Any) -> Any:
        """``values`` as the call returns them: with what was logged, when something was."""
        return Logged(values, dict(self.metrics), dict(self.extra)) if self.metrics or self.extra else values


@dataclass(frozen=True)
class Logged:
    """A call's values with what the function logged (plain data: it crosses the worker's pipe)."""

    values: Any
    metrics: dict[str, list[float]]
    extra: dict[str, list[Any]]


class TrlHooks:
    """The run's side: the progress written before each step, what the calls logged gathered per step.

    The loop calls ``begin_step`` before a step samples and ``take_metrics`` / ``take_extra`` when it logs;
    what was logged before the first step (the dry run) belongs to no step and is dropped then. Rewards
    scored ahead in another thread (rollout.max_staleness) log into the step that takes them, as TRL's
    asynchronous rollouts do.
    """

    def __init__(self, max_steps: int, environments: bool = False) -> None:
        self.max_steps = max_steps
        self.environments = environments
        """Whether the run's episodes keep environment objects (TRL's ``environment_factory``): TRL-style rewards
        then get ``environments`` (rewards/trl_style.py) and run in this process, where the objects are."""
        self._cells: list[StepCell] = []
        self._lock = threading.Lock()
        self._metrics: dict[str, list[float]] = defaultdict(list)
        self._extra: dict[str, list[Any]] = defaultdict(list)
        self._started = False

    def attach(self, cell: StepCell) -> None:
        self._cells.append(cell)
        cell.write(RewardTrainerState(global_step=0, max_steps=self.max_steps))

    def detach(self) -> None:
        """The run is over: a reward called on its own again gets none of TRL's extra arguments."""
        for cell in self._cells:
            cell.write(None)
        self.environments = False

    def begin_step(self, step: int) -> None:
        for cell in self._cells:
            cell.write(RewardTrainerState(global_step=step - 1, max_steps=self.max_steps))
        with self._lock:
            if not self._started:
                self._metrics.clear()
                self._extra.clear()
                self._started = True

    def merge(self, logged: Logged) -> None:
        with self._lock:
            for name, values in logged.metrics.items():
                self._metrics[name].extend(values)
            for column, values in logged.extra.items():
                self._extra[column].extend(values)

    def take_metrics(self) -> dict[str, float]:
        """Each logged metric's mean since the last take."""
        with self._lock:
            taken = {name: sum(v) / len(v) for name, v in self._metrics.items() if v}
            self._metrics.clear()
        return taken

    def take_extra(self) -> dict[str, list[Any]]:
        """Each logged column since the last take."""
        with self._lock:
            taken = dict(self._extra)
            self._extra.clear()
        return taken


def attach_hooks(rewards: Sequence[Any], hooks: TrlHooks) -> None:
    """Give every TRL reward among ``rewards`` (WeightedReward objects; an alias forwards the call) the run's
    ``hooks``."""
    for weighted in rewards:
        attach = getattr(weighted.reward, "attach_hooks", None)
        if callable(attach):
            attach(hooks)
