"""Failed samples in a training step: which groups they drop, how they are counted, and when the run stops
(docs/training.md, "Failed samples").

A sample fails once its retries are spent (reward calls: rewards.isolate; episodes: rollout.multiturn; an
engine's failed request is not retried). Its whole group is then dropped from the step: it sets no baseline
and gets no loss, and is never trained on as if it had scored 0 (NeMo-RL committed failed generations as
empty, zero-reward rows, which biased the advantage estimate). The step trains on the groups left
(training/sampling.py keeps them as DAPO's dynamic sampling keeps the groups with a signal: every rank
then trains on as many groups as the rank that kept fewest).

Counts are over all ranks and all of a step's rounds (one all-reduce): ``failures/<kind>`` the groups dropped,
each under the kind of its first failure (row order); ``failures/groups_dropped`` their sum;
``failures/group_share`` that over the groups drawn; ``failures/retries`` the reward calls and episodes run
again, which absorbed a failure or not. The run stops with one line when ``failures/group_share`` is over
``train.max_failed_group_share``, and when some rank has no group left to train on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from grpolab.distributed import dist
from grpolab.errors import TrainingError
from grpolab.types import FAILURE_KINDS, Failure

log = logging.getLogger(__name__)

_WARNED: set[str] = set()
"""The kinds already logged as a warning in this process: the first of each kind is a warning, the rest debug
lines (the metrics count every one)."""


class FailedGroups(TrainingError):
    """Too many of a step's groups were dropped for failed samples, or a rank has none left to train on. The
    training loop adds the step and the last good checkpoint (runtime.guards.sampling_guard)."""


def group_failures(failures: Sequence[Failure | None] | None, group_size: int) -> list[Failure | None]:
    """[P] each group's first failure in row order (None: the group is whole), from [N] per-row failures."""
    if failures is None:
        return []
    g = group_size
    return [next((f for f in failures[p : p + g] if f is not None), None) for p in range(0, len(failures), g)]


@dataclass
class FailureTally:
    """This rank's failed groups over one step's rounds."""

    drawn: int = 0
    """Groups drawn, failed or not."""
    retries: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_KINDS, 0))
    """Per kind, the groups dropped (each under its first failure)."""
    first: Failure | None = None
    drawn_everywhere: int = 0
    """Groups drawn on all ranks (set by ``metrics``)."""

    def add(self, failures: Sequence[Failure | None], retries: int) -> None:
        """One round: ``failures`` [P] per group (None: whole), ``retries`` made while drawing it."""
        self.drawn += len(failures)
        self.retries += retries
        for failure in failures:
            if failure is None:
                continue
            self.dropped[failure.kind] += 1
            self.first = self.first or failure
            level = logging.DEBUG if failure.kind in _WARNED else logging.WARNING
            _WARNED.add(failure.kind)
            log.log(level, "a group was dropped from the step (%s; counted in failures/%s): %s", failure.kind,
                    failure.kind, failure.message)  # fmt: skip

    def metrics(self) -> dict[str, float]:
        """The step's counts over all ranks (module docstring); every rank passes the same keys."""
        local = {f"failures/{kind}": float(n) for kind, n in self.dropped.items()}
        total = dist.sum_dict({**local, "failures/retries": float(self.retries), "drawn": float(self.drawn)})
        self.drawn_everywhere = int(total.pop("drawn"))
        dropped = sum(total[f"failures/{kind}"] for kind in FAILURE_KINDS)
        share = dropped / self.drawn_everywhere if self.drawn_everywhere else 0.0
        return {**total, "failures/groups_dropped": dropped, "failures/group_share": share}

    def check(self, metrics: dict[str, float], limit: float, left: int) -> None:
        """Raise FailedGroups when the share dropped is over ``limit`` (train.max_failed_group_share), or when
        ``left`` (the fewest groups any rank has left to train on) is 0. ``metrics``: from ``metrics()``, the
        same on every rank, so every rank raises together."""
        share, dropped = metrics["failures/group_share"], int(metrics["failures/groups_dropped"])
        if share <= limit and left > 0:
            return
        drawn = self.drawn_everywhere
        kinds = ", ".join(f"{kind} {int(metrics[f'failures/{kind}'])}" for kind in FAILURE_KINDS if metrics[f"failures/{kind}"])
        (firsts,) = dist.gather_lists([self.first.message] if self.first else [])  # some rank's, in rank order
        first = firsts[0] if firsts else "none"
        what = f"{dropped} of {drawn} groups ({share:.0%}) were dropped for failed samples ({kinds}; the first: {first})"
        if share > limit:
            why = f"{what}, more than train.max_failed_group_share={limit:g}"
        else:
            why = f"{what}, and a rank has no group left to train on"
        raise FailedGroups(
            f"{why}. Fix what failed, give it more retries (reward.max_retries, env.max_retries), or raise "
            "train.max_failed_group_share"
        )
