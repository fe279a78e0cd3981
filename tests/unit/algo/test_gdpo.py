"""GDPO (algo/gdpo.py): a hand-computed batch, and TRL 1.16's ``multi_objective_aggregation=
"normalize_then_sum"`` (trl/trainer/grpo_trainer.py ``_generate_and_score_completions``, written out below,
one process) on random rewards with missing values."""

import pytest
import torch

from grpolab.algo.advantages import grpo_advantages
from grpolab.algo.gdpo import gdpo_advantages


def close(actual, expected, **kw):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), **kw)


def test_each_function_is_normalised_in_its_group_before_the_weighted_sum():
    # two prompts x 2 completions, two functions; eps 0 and population stds keep the numbers round
    values = torch.tensor([[[1.0, 0.0], [0.0, 0.0]], [[1.0, 10.0], [1.0, 0.0]]])  # [P, G, K]
    valid = torch.ones_like(values, dtype=torch.bool)
    # group 0: f0 (1, 0) -> (1, -1), f1 equal -> 0; group 1: f0 equal -> 0, f1 (10, 0) -> (1, -1)
    # weights (1, 0.5): sums (1, -1, 0.5, -0.5); batch mean 0, population std sqrt(2.5 / 4)
    out = gdpo_advantages(values, valid, torch.tensor([1.0, 0.5]), std="population", eps=0.0)
    close(out, torch.tensor([[1.0, -1.0], [0.5, -0.5]]) / (2.5 / 4) ** 0.5)
    # GRPO on the weighted sum gives both groups the same advantages: f1's 10x scale no longer drowns f0
    summed = (values * torch.tensor([1.0, 0.5])).sum(-1)
    close(grpo_advantages(summed, std="population", eps=0.0), [[1.0, -1.0], [1.0, -1.0]])


def test_a_function_that_does_not_apply_adds_nothing_and_an_unscored_completion_gets_zero():
    values = torch.tensor([[[1.0, 5.0], [0.0, 0.0], [0.0, 7.0]]])  # [1, 3, 2]
    valid = torch.tensor([[[True, True], [True, False], [False, False]]])
    # f0 counted on completions 0, 1: (0.5, -0.5) / std(1, 0) = +-0.7071; f1 has one value: 0; completion 2: none
    out = gdpo_advantages(values, valid, torch.tensor([1.0, 1.0]), eps=0.0)
    assert out[0, 2] == 0.0
    close(out[0, :2], [0.7071068, -0.7071068])  # then whitened over the two scored: unchanged
    with pytest.raises(ValueError, match=r"weights must be \[K\]"):
        gdpo_advantages(values, valid, torch.ones(3))


def _nanstd(tensor, dim=None, keepdim=False):
    """trl.trainer.utils.nanstd."""
    mean = torch.nanmean(tensor, dim=dim, keepdim=True)
    variance = torch.nanmean((tensor - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(tensor), dim=dim, keepdim=True)
    correction = count / (count - 1)
    correction = torch.where(count > 1, correction, torch.full_like(correction, float("nan")))
    std = torch.sqrt(variance * correction)
    return std if keepdim else std.squeeze() if dim is None else std.squeeze(dim)


def _trl_gdpo(rewards_per_func, reward_weights, num_generations):
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.shape[1])
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    std_k = _nanstd(grouped, dim=1, keepdim=True)
    reward_k = (grouped - mean_k) / (std_k + 1e-4)
    reward_k = reward_k.view(-1, rewards_per_func.shape[1])
    rewards = (reward_k * reward_weights.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable_mask] = torch.nan
    std_rewards = _nanstd(rewards).expand_as(rewards)
    advantages = (rewards - torch.nanmean(rewards)) / (std_rewards + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def test_gdpo_is_trls_normalize_then_sum():
    gen = torch.Generator().manual_seed(0)
    p, g, k = 6, 4, 3
    values = torch.randint(0, 3, (p, g, k), generator=gen).float() * torch.tensor([1.0, 10.0, 0.1])
    valid = torch.rand(p, g, k, generator=gen) > 0.15
    valid[0, 1] = False  # a completion no function scored
    weights = torch.tensor([1.0, 0.5, 2.0])
    trl_in = torch.where(valid, values, torch.nan).view(p * g, k)
    close(gdpo_advantages(values, valid, weights).flatten(), _trl_gdpo(trl_in, weights, g), atol=1e-5, rtol=1e-5)
