"""The step's reward and completion metrics under TRL's names, pinned to hand-computed values."""

import math

import pytest
import torch

from grpolab.training.batch import length_by_reward, rollout_metrics, step_tokens
from grpolab.types import Completions


def _completions(lengths, finish, prompt_lengths, g):
    n, t = len(lengths), max(lengths)
    mask = torch.tensor([[j < n_ for j in range(t)] for n_ in lengths])
    return Completions(
        prompt_ids=[[1] * p for p in prompt_lengths],
        completion_ids=torch.ones(n, t, dtype=torch.long),
        completion_mask=mask,
        logprobs=torch.zeros(n, t),
        texts=["x"] * n,
        finish_reasons=finish,
        num_generations=g,
    )


# P = 2 prompts x G = 3; completion lengths 2, 4, 6 | 3, 5, 8; the 6- and 8-token ones were cut
COMPLETIONS = _completions([2, 4, 6, 3, 5, 8], ["stop", "stop", "length", "stop", "stop", "length"], [3, 3, 3, 5, 5, 5], 3)
REWARDS = torch.tensor([[0.2, 0.5, 0.8], [1.0, 1.0, 1.0]], dtype=torch.float64)
VALID = torch.ones(2, 3, dtype=torch.bool)


def test_trl_names_and_definitions():
    m = rollout_metrics(COMPLETIONS, REWARDS, VALID, torch.zeros(2, 3))
    assert m["reward"] == pytest.approx((0.2 + 0.5 + 0.8 + 3.0) / 6)
    mean = 4.5 / 6
    std = math.sqrt(sum((r - mean) ** 2 for r in (0.2, 0.5, 0.8, 1.0, 1.0, 1.0)) / 5)  # TRL's nanstd: unbiased
    assert m["reward_std"] == pytest.approx(std)
    assert m["frac_reward_zero_std"] == pytest.approx(0.5)  # the second group: all 1.0
    assert m["completions/mean_length"] == pytest.approx(28 / 6)
    assert (m["completions/min_length"], m["completions/max_length"]) == (2.0, 8.0)
    assert m["completions/clipped_ratio"] == pytest.approx(2 / 6)
    assert m["completions/mean_terminated_length"] == pytest.approx((2 + 4 + 3 + 5) / 4)
    assert (m["completions/min_terminated_length"], m["completions/max_terminated_length"]) == (2.0, 5.0)


def test_terminated_lengths_are_zero_when_every_completion_was_cut():
    cut = _completions([4, 4], ["length", "length"], [1, 1], 2)
    m = rollout_metrics(cut, torch.tensor([[0.0, 1.0]]), torch.ones(1, 2, dtype=torch.bool), torch.zeros(1, 2))
    assert (m["completions/mean_terminated_length"], m["completions/max_terminated_length"]) == (0.0, 0.0)


def test_num_tokens_of_a_step_counts_prompt_and_completion_tokens_of_every_sequence():
    assert step_tokens(COMPLETIONS) == 3 * 3 + 3 * 5 + 28


def test_length_by_reward_splits_at_the_group_mean_for_any_reward_scale():
    out = length_by_reward(COMPLETIONS, REWARDS, VALID)
    # group 1 (mean 0.5): 0.8 above (6 tokens), 0.2 below (2 tokens), 0.5 neither; group 2: all equal, neither
    assert out == {"rollout/len_above_group_mean": 6.0, "rollout/len_below_group_mean": 2.0}
    scaled = length_by_reward(COMPLETIONS, REWARDS * 100 - 30, VALID)  # no 0.5 threshold: same split
    assert scaled == out


def test_length_by_reward_leaves_out_invalid_rewards_and_equal_groups():
    rewards = torch.tensor([[0.1, 0.1, 0.1], [0.0, 3.0, 9.0]], dtype=torch.float64)
    valid = torch.tensor([[True, True, True], [True, True, False]])
    # group 1: equal (a rounded mean 0.1000...02 must not call them below); group 2: mean of 0 and 3 is 1.5
    assert length_by_reward(COMPLETIONS, rewards, valid) == {
        "rollout/len_above_group_mean": 5.0,
        "rollout/len_below_group_mean": 3.0,
    }
