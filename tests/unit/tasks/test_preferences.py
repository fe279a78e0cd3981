"""The built-in preference pairs (tasks/preferences.py): the hacking miniature's narrow set."""

from __future__ import annotations

from grpolab.tasks.arithmetic import arithmetic_examples
from grpolab.tasks.preferences import length_shortcut_pairs
from grpolab.types import Example


def test_length_shortcut_pairs_reject_the_answer_less_one_digit():
    examples = arithmetic_examples(size=50, seed=0, digits=3)
    rows = length_shortcut_pairs(examples, seed=0)
    assert len(rows) == 50
    for e, r in zip(examples, rows, strict=True):
        assert r["prompt"] == e.prompt and r["chosen"] == e.answer
        assert len(r["rejected"]) == len(r["chosen"]) - 1  # "longer is better" ranks every pair
        assert any(r["chosen"][:i] + r["chosen"][i + 1 :] == r["rejected"] for i in range(len(r["chosen"])))
    assert length_shortcut_pairs([Example(prompt="1+0=", answer="1")], seed=0) == []  # nothing to cut
