"""The built-in preference pairs (tasks/preferences.py)."""

from __future__ import annotations

from grpolab.tasks.preferences import max_digit_preference_pairs, prompt_blind_accuracy


def test_max_digit_pairs_defeat_prompt_blind_rules():
    rows = max_digit_preference_pairs(size=200, seed=0)
    assert all(r["chosen"] == max(r["prompt"][4:-2].split(",")) != r["rejected"] for r in rows)
    assert prompt_blind_accuracy(rows) < 0.65  # lists holding 9 have no larger absent digit
