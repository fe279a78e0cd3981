"""REINFORCE++ (full and -baseline, algo/reinforce.py) pinned to hand-computed numbers."""

import itertools
import math

import torch

from grpolab.algo.advantages import OUTCOME_ESTIMATORS
from grpolab.algo.reinforce import TOKEN_ESTIMATORS, reinforce_pp_advantages, reinforce_pp_baseline_advantages


def close(actual, expected, **kw):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), **kw)


RAGGED = torch.tensor([[True, True, True], [True, True, False]])


def test_reinforce_pp_kl_in_every_token_reward_return_to_go_then_token_whitening():
    # arXiv 2501.03262 Eqs. 8-10, beta = 0.5, gamma = 1.
    # token rewards: row 0 [-0.05, -0.10, -0.15 + 1] ; row 1 [-0.25, 0.05 + 0]
    # returns-to-go: row 0 [0.70, 0.75, 0.85] ; row 1 [-0.20, 0.05]
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.5, -0.1, 0.0]])
    adv = reinforce_pp_advantages(torch.tensor([1.0, 0.0]), RAGGED, token_kl=kl, beta=0.5, gamma=1.0)
    returns = [0.70, 0.75, 0.85, -0.20, 0.05]
    mean = sum(returns) / 5  # 0.43
    std = math.sqrt(sum((x - mean) ** 2 for x in returns) / 4 + 1e-8)  # unbiased, over the 5 tokens
    z = [(x - mean) / std for x in returns]
    close(adv, [z[:3], [z[3], z[4], 0.0]], atol=1e-5, rtol=0)
    # gamma discounts the return (row 1 becomes [-0.25 + 0.5 * 0.05, 0.05], and so on)
    discounted = reinforce_pp_advantages(torch.tensor([1.0, 0.0]), RAGGED, token_kl=kl, beta=0.5, gamma=0.5)
    assert not torch.allclose(adv, discounted)


def test_reinforce_pp_baseline_weights_tokens_and_recentres():
    # rewards [1, 0]: group-centred [0.5, -0.5]; completion 0 has 3 tokens, completion 1 has 1.
    # token values [.5 .5 .5 -.5]: mean .25, unbiased var (3 * .0625 + .5625) / 3 = .25 -> std .5
    mask = torch.tensor([[True, True, True], [True, False, False]])
    adv = reinforce_pp_baseline_advantages(torch.tensor([[1.0, 0.0]]), mask)
    close(adv, [[0.5, 0.5, 0.5], [-1.5, 0.0, 0.0]], atol=1e-6, rtol=0)
    # the per-sequence "group mean, batch std" estimator gives +-0.7071 here: a different estimator
    seq = OUTCOME_ESTIMATORS["batch_std"](torch.tensor([[1.0, 0.0]]), torch.ones(1, 2, dtype=torch.bool), eps=0.0)
    close(seq, [[0.7071, -0.7071]], atol=1e-4, rtol=0)


def test_reinforce_pp_baseline_leaves_invalid_rows_out():
    mask = torch.ones(4, 2, dtype=torch.bool)
    valid = torch.tensor([[True, True, True, False]])
    adv = reinforce_pp_baseline_advantages(torch.tensor([[1.0, 0.0, 0.0, 7.0]]), mask, valid)
    assert torch.equal(adv[3], torch.zeros(2))
    # centred [2/3, -1/3, -1/3] on 2 tokens each: mean 0, unbiased var (2 * (4/9 + 1/9 + 1/9)) / 5 = 4/15
    close(adv[0], [(2 / 3) / math.sqrt(4 / 15)] * 2, atol=1e-5, rtol=0)


def test_token_estimators_differ():
    rewards = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    valid = torch.ones_like(rewards, dtype=torch.bool)
    mask = torch.tensor([[True] * 3, [True, True, False], [True, False, False]] * 2)
    kl = torch.full(mask.shape, 0.1)
    outs = {name: fn(rewards, valid, mask, kl, beta=0.1, gamma=1.0) for name, fn in TOKEN_ESTIMATORS.items()}
    for a, b in itertools.combinations(outs, 2):
        assert not torch.allclose(outs[a], outs[b]), f"{a} behaves like {b}"
