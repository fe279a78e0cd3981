"""Reward-model training pieces: the Bradley-Terry loss, the held-out split, reading comparisons."""

from __future__ import annotations

import math

import pytest
import torch

from grpolab.data import DataError
from grpolab.tasks.preferences import max_digit_preference_pairs, prompt_blind_accuracy
from grpolab.commands.train_rm import (
    PreferencePair,
    bradley_terry_loss,
    read_pairs,
    split_pairs,
    write_pairs,
)


def test_bradley_terry_loss_hand_values():
    # -log sigmoid(2) = 0.126928, -log sigmoid(0) = log 2 = 0.693147
    scores = torch.tensor([[2.0, 0.0], [1.5, 1.5]], requires_grad=True)
    loss = bradley_terry_loss(scores)
    assert loss.item() == pytest.approx((0.126928 + math.log(2)) / 2, abs=1e-6)
    loss.backward()  # d/dr_c = -(1 - sigmoid(margin)) / n: pushes chosen up and rejected down
    assert scores.grad[0, 0] < 0 < scores.grad[0, 1] and scores.grad[1, 0] == pytest.approx(-0.25)


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


def test_max_digit_pairs_defeat_prompt_blind_rules():
    rows = max_digit_preference_pairs(size=200, seed=0)
    assert all(r["chosen"] == max(r["prompt"][4:-2].split(",")) != r["rejected"] for r in rows)
    assert prompt_blind_accuracy(rows) < 0.65  # lists holding 9 have no larger absent digit
