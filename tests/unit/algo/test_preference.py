"""The reward model's Bradley-Terry loss, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from grpolab.algo.preference import bradley_terry_loss


def test_bradley_terry_loss_hand_values():
    # -log sigmoid(2) = 0.126928, -log sigmoid(0) = log 2 = 0.693147
    scores = torch.tensor([[2.0, 0.0], [1.5, 1.5]], requires_grad=True)
    loss = bradley_terry_loss(scores)
    assert loss.item() == pytest.approx((0.126928 + math.log(2)) / 2, abs=1e-6)
    loss.backward()  # d/dr_c = -(1 - sigmoid(margin)) / n: pushes chosen up and rejected down
    assert scores.grad[0, 0] < 0 < scores.grad[0, 1] and scores.grad[1, 0] == pytest.approx(-0.25)


def test_scores_must_be_pairs():
    with pytest.raises(ValueError, match=r"\[n, 2\]"):
        bradley_terry_loss(torch.zeros(3))
