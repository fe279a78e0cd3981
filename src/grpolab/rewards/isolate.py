"""Scoring whole groups so that a failure stays with the groups it hit (docs/training.md, "Failed samples").

``score_groups`` scores a batch of whole groups with ``score_batch``. When that call fails (a reward raised,
timed out, its worker or sandbox died, or it returned a non-finite value or nothing usable: any RewardError),
the reward calls are made again on each group alone, up to ``max_retries`` times per group. A group whose
calls all failed is failed; the others get their scores. A failure never becomes a score: the rows of a
failed group have no total and no component and carry the failure (``ScoreResult.failures``), and the
training step drops the whole group (training/sampling.py).

Groups the sampler failed already (an engine error, an environment that crashed: ``failed``) are not scored:
a reward of a half-run episode means nothing.

Every group gets its retries, even when most fail: giving up early would drop whole groups that were never
tried, and could stop a run whose step (all ranks, all rounds) is under its limit. The price is paid by a
reward that fails everywhere: one that hangs on every call takes (1 + groups x ``max_retries``) x
``timeout_s`` before the step's failed share stops the run; lower reward.max_retries for such a reward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from grpolab.errors import RewardError, one_line
from grpolab.rewards.base import ScoreResult, WeightedReward, merge_scores, score_batch
from grpolab.types import Completion, Example, Failure


def failure_of(err: RewardError) -> Failure:
    """The failure a reward error is counted as (``RewardError.failure_kind``), with its message on one line."""
    return Failure(err.failure_kind, one_line(err))  # type: ignore[arg-type]


def score_groups(
    rewards: Sequence[WeightedReward],
    completions: Sequence[Completion],
    examples: Sequence[Example],
    *,
    group_size: int,
    timeout_s: float | None,
    max_retries: int = 1,
    failed: Sequence[Failure | None] | None = None,
    first_index: int = 0,
) -> ScoreResult:
    """Score ``len(completions) // group_size`` whole groups (module docstring). ``failed`` [N]: the sampler's
    failures, whose groups are not scored. ``first_index``: the index of ``completions[0]`` in its step."""
    if len(completions) % group_size:
        raise ValueError(f"{len(completions)} completions are not whole groups of {group_size}")
    g = group_size
    groups = len(completions) // g
    failure: dict[int, Failure] = {}
    for p in range(groups):
        first = next((f for f in (failed or ())[p * g : (p + 1) * g] if f is not None), None)
        if first is not None:
            failure[p] = first
    healthy = [p for p in range(groups) if p not in failure]

    def score(ps: list[int]) -> ScoreResult:
        seqs = [p * g + j for p in ps for j in range(g)]
        start = first_index + ps[0] * g
        return score_batch(rewards, [completions[i] for i in seqs], [examples[i] for i in seqs], timeout_s=timeout_s, first_index=start)

    scored: dict[int, ScoreResult] = {}
    retries = 0
    try:
        if healthy:
            scored.update(zip(healthy, _split(score(healthy), len(healthy), g), strict=True))
    except RewardError as err:
        for p in healthy:
            if max_retries < 1:
                failure[p] = failure_of(err)
                continue
            got, tries = _retried(score, p, max_retries)
            retries += tries
            if isinstance(got, Failure):
                failure[p] = got
            else:
                scored[p] = got
    return dataclasses.replace(_assemble(rewards, scored, failure, groups, g), retries=retries)


def _retried(score, p: int, max_retries: int) -> tuple[ScoreResult | Failure, int]:
    """(group ``p``'s scores, or the failure of its last call; the calls made), calling it alone until one works."""
    for tries in range(1, max_retries + 1):
        try:
            return score([p]), tries
        except RewardError as err:
            last = failure_of(err)
    return last, max_retries


def _split(result: ScoreResult, groups: int, g: int) -> list[ScoreResult]:
    """One batch's scores as one ScoreResult per group (the call's seconds and counts on the first)."""
    return [
        ScoreResult(
            total=result.total[p * g : (p + 1) * g],
            components={k: v[p * g : (p + 1) * g] for k, v in result.components.items()},
            seconds=result.seconds if p == 0 else {},
            counts=result.counts if p == 0 else {},
        )
        for p in range(groups)
    ]


def _assemble(rewards, scored: dict[int, ScoreResult], failure: dict[int, Failure], groups: int, g: int) -> ScoreResult:
    """Every group's rows in order: the scored ones' values, the failed ones' failure (no value at all)."""
    names = [wr.name for wr in rewards]
    parts = []
    for p in range(groups):
        if p in scored:
            parts.append(scored[p])
        else:
            parts.append(
                ScoreResult(total=[None] * g, components={n: [None] * g for n in names}, failures=[failure[p]] * g)
            )
    if not parts:
        return ScoreResult(total=[], components={n: [] for n in names})
    return merge_scores(parts)
