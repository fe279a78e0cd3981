"""Reward-model training pieces: the Bradley-Terry loss, the held-out split, reading comparisons."""

from __future__ import annotations

import pytest

from grpolab.commands.train_rm import (
    PreferencePair,
    read_pairs,
    split_pairs,
    write_pairs,
)
from grpolab.data import DataError


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
