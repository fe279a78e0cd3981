"""Bootstrap intervals over prompts: hand-checkable cases and the pairing's effect."""

from __future__ import annotations

import math
import random

import pytest

from grpolab.eval.intervals import bootstrap_mean, bootstrap_paired_diff, mean_and_se


def test_constant_values_give_a_point_interval():
    iv = bootstrap_mean([0.25] * 10)
    assert (iv.value, iv.low, iv.high) == (0.25, 0.25, 0.25)


def test_the_interval_covers_the_mean_and_narrows_with_more_prompts():
    rng = random.Random(1)
    small = [float(rng.random() < 0.3) for _ in range(20)]
    large = [float(rng.random() < 0.3) for _ in range(500)]
    a, b = bootstrap_mean(small), bootstrap_mean(large)
    assert a.low <= a.value <= a.high and b.low <= b.value <= b.high
    assert (b.high - b.low) < (a.high - a.low) / 3  # ~sqrt(25) = 5x narrower
    p = b.value  # the binomial's 95% half-width, 1.96 sqrt(p(1-p)/n)
    assert (b.high - b.low) / 2 == pytest.approx(1.96 * math.sqrt(p * (1 - p) / 500), rel=0.15)


def test_the_same_values_and_seed_give_the_same_interval():
    values = [0.1, 0.9, 0.4, 0.0, 1.0]
    assert bootstrap_mean(values, seed=3) == bootstrap_mean(values, seed=3)


def test_pairing_removes_the_spread_of_prompt_difficulty():
    before = [i / 40 for i in range(40)]  # prompts from easy to hard
    after = [b + 0.05 for b in before]  # every prompt gains 0.05
    diff = bootstrap_paired_diff(before, after)
    assert diff.value == pytest.approx(0.05)
    assert diff.high - diff.low < 1e-9  # the same gain everywhere: no uncertainty left
    assert not diff.contains(0.0)
    with pytest.raises(ValueError, match="equal lengths"):
        bootstrap_paired_diff([0.1], [0.1, 0.2])


def test_mean_and_se():
    mean, se = mean_and_se([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5
    assert se == pytest.approx(math.sqrt((1.5**2 * 2 + 0.5**2 * 2) / 3 / 4))
    assert mean_and_se([5.0]) == (5.0, 0.0)
