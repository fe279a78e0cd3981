"""Intervals over held-out prompts: a percentile bootstrap of a mean and of a paired difference.

An evaluation's uncertainty is mostly in which prompts were drawn, not in the samples of one prompt
(64 samples pin a prompt's pass@K well; 30 prompts pin the mean poorly), so both resample prompts. The
difference is paired: the same prompts before and after training, resampled together, which is far
narrower than two separate intervals when the prompts' difficulty varies more than the change. Pure
Python, seeded: the same lists give the same interval.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Interval", "bootstrap_mean", "bootstrap_paired_diff", "mean_and_se"]


@dataclass(frozen=True)
class Interval:
    value: float
    """The estimate on the prompts as drawn."""
    low: float
    high: float
    level: float

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high

    def __str__(self) -> str:
        return f"{self.value:+.3f} [{self.low:+.3f}, {self.high:+.3f}]"


def _percentiles(stats: list[float], level: float) -> tuple[float, float]:
    stats.sort()
    tail = (1.0 - level) / 2
    lo = stats[min(len(stats) - 1, max(0, math.floor(tail * len(stats))))]
    hi = stats[min(len(stats) - 1, max(0, math.ceil((1.0 - tail) * len(stats)) - 1))]
    return lo, hi


def bootstrap_mean(values: Sequence[float], *, reps: int = 2000, level: float = 0.95, seed: int = 0) -> Interval:
    """The mean of ``values`` with a percentile-bootstrap interval (prompts resampled with replacement)."""
    if not values:
        raise ValueError("bootstrap_mean needs at least one value")
    n, rng = len(values), random.Random(seed)
    stats = [math.fsum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(reps)]
    lo, hi = _percentiles(stats, level)
    return Interval(math.fsum(values) / n, lo, hi, level)


def bootstrap_paired_diff(
    before: Sequence[float], after: Sequence[float], *, reps: int = 2000, level: float = 0.95, seed: int = 0
) -> Interval:
    """mean(after - before) over paired prompts, with a percentile-bootstrap interval."""
    if len(before) != len(after):
        raise ValueError(f"paired values need equal lengths, got {len(before)} and {len(after)}")
    return bootstrap_mean([a - b for a, b in zip(after, before, strict=True)], reps=reps, level=level, seed=seed)


def mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error (sample std / sqrt(n); 0 for one value)."""
    if not values:
        raise ValueError("mean_and_se needs at least one value")
    n = len(values)
    mean = math.fsum(values) / n
    if n == 1:
        return mean, 0.0
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)
