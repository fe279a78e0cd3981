"""The reward model's pairwise loss (``grpolab train-rm``): Bradley-Terry on (chosen, rejected) scores.

InstructGPT (arXiv 2203.02155, Eq. 1) and DeepSeekMath's reward models train a scalar head so that
sigma(r_chosen - r_rejected) is the probability that the chosen answer is preferred.
"""

from __future__ import annotations

import torch
from torch import Tensor


def bradley_terry_loss(scores: Tensor) -> Tensor:
    """Mean of -log sigmoid(r_chosen - r_rejected) over ``[n, 2]`` scores (chosen first)."""
    if scores.ndim != 2 or scores.shape[1] != 2:
        raise ValueError(f"scores must be [n, 2] (chosen, rejected), got {tuple(scores.shape)}")
    return -torch.nn.functional.logsigmoid(scores[:, 0] - scores[:, 1]).mean()
