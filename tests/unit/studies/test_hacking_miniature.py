"""The miniature's pieces that run in milliseconds: its narrow preference set and its config."""

from __future__ import annotations

from grpolab.studies.hacking_miniature import miniature_config
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


def test_miniature_config_trains_on_a_proxy_and_watches_exact_match(tmp_path):
    cfg = miniature_config(tmp_path / "mini", ["train.num_steps=7"])
    assert cfg.run_dir == tmp_path / "mini" and cfg.train.num_steps == 7
    assert [g.name for g in cfg.reward.gold] == ["exact_match"]
    assert cfg.rollout.max_completion_length == 8 and cfg.data.source == "arithmetic"
