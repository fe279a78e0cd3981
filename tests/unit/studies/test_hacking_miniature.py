"""The miniature's pieces that run in milliseconds: its config (its preference set: tests/unit/tasks/test_preferences.py)."""

from __future__ import annotations

from grpolab.studies.hacking_miniature import miniature_config


def test_miniature_config_trains_on_a_proxy_and_watches_exact_match(tmp_path):
    cfg = miniature_config(tmp_path / "mini", ["train.num_steps=7"])
    assert cfg.run_dir == tmp_path / "mini" and cfg.train.num_steps == 7
    assert [g.name for g in cfg.reward.gold] == ["exact_match"]
    assert cfg.rollout.max_completion_length == 8 and cfg.data.source == "arithmetic"
