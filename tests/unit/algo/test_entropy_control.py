"""Skywork-OR1's adaptive entropy control as TRL runs it: the coefficient moves once per optimizer step, and a
step applies it only when the previous step's entropy was at or below the target."""

from __future__ import annotations

import math

import pytest

from grpolab.algo.entropy_control import AdaptiveEntropy


def test_the_coefficient_follows_the_entropy_within_its_bounds():
    c = AdaptiveEntropy(coef=0.01, target=0.5, delta=0.005, coef_min=0.0, coef_max=0.02)
    assert c.applied() == 0.0  # nothing measured yet: no bonus on the first step
    c.observe(0.3)  # at or below the target: up
    assert (c.coef, c.applied()) == (pytest.approx(0.015), pytest.approx(0.015))
    c.observe(0.5)  # the target itself counts as below
    assert c.coef == pytest.approx(0.02)
    c.observe(0.1)  # capped at coef_max
    assert c.coef == pytest.approx(0.02)
    c.observe(0.9)  # above: down, and the next step applies nothing
    assert (c.coef, c.applied()) == (pytest.approx(0.015), 0.0)
    for _ in range(5):
        c.observe(2.0)
    assert c.coef == 0.0  # floored at coef_min


def test_its_state_round_trips():
    c = AdaptiveEntropy(coef=0.01, target=0.5, delta=0.005)
    assert c.state_dict() == {"coef": 0.01, "last_entropy": math.inf}
    c.observe(0.2)
    fresh = AdaptiveEntropy(coef=0.01, target=0.5, delta=0.005)
    fresh.load_state_dict(c.state_dict())
    assert (fresh.coef, fresh.last_entropy, fresh.applied()) == (pytest.approx(0.015), 0.2, pytest.approx(0.015))
