"""Reward-model training pieces: the Bradley-Terry loss, the held-out split, reading comparisons."""

from __future__ import annotations

import pytest

from grpolab.cli import main
from grpolab.commands.train_rm import (
    PreferencePair,
    read_pairs,
    split_pairs,
    write_pairs,
)
from grpolab.config import load_config
from grpolab.data import DataError
from grpolab.runtime.lock import hold_run_dir


def test_held_out_split_is_by_prompt_and_seeded():
    pairs = [PreferencePair(f"p{i % 10}", "a", f"b{i}") for i in range(40)]
    train, held = split_pairs(pairs, 0.2, seed=0)
    assert {p.prompt for p in train}.isdisjoint({p.prompt for p in held})
    assert len({p.prompt for p in held}) == 2 and len(held) == 8
    assert split_pairs(pairs, 0.2, seed=0) == (train, held) and split_pairs(pairs, 0.0, seed=0) == (pairs, [])


def test_read_pairs_round_trip_and_errors(tmp_path):
    pairs = [PreferencePair("q", "good", "bad")]
    write_pairs(tmp_path / "ok.jsonl", pairs)
    assert read_pairs(tmp_path / "ok.jsonl") == pairs
    (tmp_path / "bad.jsonl").write_text(
        '{"prompt": "q", "chosen": "a", "rejected": "b"}\n{"prompt": "q", "chosen": "a"}\n'
    )
    with pytest.raises(DataError, match=r"bad.jsonl:2 needs string fields rejected"):
        read_pairs(tmp_path / "bad.jsonl")


def test_a_second_train_rm_into_a_held_folder_is_one_line(tiny_model_dir, tmp_path, capsys):
    """Another run holds the reward model's folder: grpolab train-rm stops with one line, before any model loads."""
    write_pairs(tmp_path / "pairs.jsonl", [PreferencePair(f"q{i}", "good", "bad") for i in range(4)])
    overrides = [
        f"reward_model.base_model={tiny_model_dir}",
        f"reward_model.data_path={tmp_path / 'pairs.jsonl'}",
        f"log.output_dir={tmp_path}",
        "log.run_name=rm",
    ]
    with hold_run_dir(load_config(None, overrides).reward_model_dir):
        assert main(["train-rm", *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("grpolab: error: ") and "in use by another run" in err[0]
    assert err[0].endswith("choose another reward_model.output_dir")
