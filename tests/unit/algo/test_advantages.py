import itertools

import pytest
import torch

from grpolab.algo.advantages import (
    OUTCOME_ESTIMATORS,
    gae_advantages,
    grpo_advantages,
    grpo_process_advantages,
    kl_shaped_token_rewards,
    rft_advantages,
    rloo_advantages,
)

R = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
TWO_GROUPS = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])


def close(actual, expected, **kw):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), **kw)


# --- outcome -------------------------------------------------------------------------------------


def test_grpo_group_std_variants_pinned():
    close(grpo_advantages(R, std="unbiased", eps=0.0), [[1.5, -0.5, -0.5, -0.5]])
    close(
        grpo_advantages(R, std="population", eps=0.0),
        [[1.7321, -0.5774, -0.5774, -0.5774]],
        atol=1e-4,
        rtol=0,
    )
    # default: unbiased, eps = 1e-4 added to the std
    close(grpo_advantages(R), [[0.75 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001]])


def test_dr_grpo_and_rloo_hand_values():
    close(grpo_advantages(R, scale="none"), [[0.75, -0.25, -0.25, -0.25]])
    close(rloo_advantages(R), [[1.0, -1 / 3, -1 / 3, -1 / 3]])


def test_batch_scale_divides_by_std_of_centred_batch():
    # centred: [.75 -.25 -.25 -.25], [.5 .5 -.5 -.5]; sum of squares 1.75 over 8 values
    close(
        grpo_advantages(TWO_GROUPS, scale="batch", eps=0.0), [[1.5, -0.5, -0.5, -0.5], [1.0, 1.0, -1.0, -1.0]]
    )
    pop = (1.75 / 8) ** 0.5
    expected = torch.tensor([[0.75, -0.25, -0.25, -0.25], [0.5, 0.5, -0.5, -0.5]]) / pop
    close(grpo_advantages(TWO_GROUPS, scale="batch", std="population", eps=0.0), expected)
    group = grpo_advantages(TWO_GROUPS, scale="group", eps=0.0)
    assert not torch.allclose(group[1], torch.tensor([1.0, 1.0, -1.0, -1.0]))


def test_batch_reward_scale_divides_by_std_of_the_rewards_themselves():
    # rewards 1 0 0 0 1 1 0 0: mean 3/8, squares 3 (5/8)^2 + 5 (3/8)^2 = 120/64, unbiased variance 120/448
    std = (120 / 448) ** 0.5
    expected = torch.tensor([[0.75, -0.25, -0.25, -0.25], [0.5, 0.5, -0.5, -0.5]]) / std
    close(grpo_advantages(TWO_GROUPS, scale="batch_reward", eps=0.0), expected)
    # TRL's scale_rewards="batch": (r - group mean) / (rewards.std() + 1e-4)
    flat = TWO_GROUPS.flatten()
    trl = (flat - TWO_GROUPS.mean(1).repeat_interleave(4)) / (flat.std() + 1e-4)
    close(grpo_advantages(TWO_GROUPS, scale="batch_reward").flatten(), trl)


@pytest.mark.parametrize("scale", ["group", "batch", "batch_reward", "none"])
def test_equal_rewards_give_exactly_zero(scale):
    rewards = torch.tensor([[0.1, 0.1, 0.1], [0.7, 0.7, 0.7], [1.0, 0.0, 0.3]])
    adv = grpo_advantages(rewards, scale=scale)
    assert torch.equal(adv[:2], torch.zeros(2, 3))
    assert torch.equal(rloo_advantages(rewards)[:2], torch.zeros(2, 3))


@pytest.mark.parametrize("scale", ["group", "batch", "batch_reward", "none"])
def test_group_advantages_sum_to_zero(scale):
    rewards = torch.rand(5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    close(grpo_advantages(rewards, scale=scale).sum(1), torch.zeros(5), atol=1e-12, rtol=0)
    close(rloo_advantages(rewards).sum(1), torch.zeros(5), atol=1e-12, rtol=0)


def test_rloo_is_scaled_dr_grpo_and_leave_one_out():
    rewards = torch.rand(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    close(rloo_advantages(rewards), 5 / 4 * grpo_advantages(rewards, scale="none"))
    for p, i in itertools.product(range(3), range(5)):
        others = torch.cat([rewards[p, :i], rewards[p, i + 1 :]])
        assert rloo_advantages(rewards)[p, i].item() == pytest.approx((rewards[p, i] - others.mean()).item())


def test_valid_entries_are_excluded_and_zeroed():
    rewards = torch.tensor([[1.0, 0.0, 99.0, 0.0], [5.0, 3.0, 2.0, 1.0]])
    valid = torch.tensor([[True, True, False, True], [False, True, False, False]])
    adv = grpo_advantages(rewards, valid=valid, eps=0.0)
    s = 3**-0.5  # unbiased std of [1, 0, 0]
    close(adv[0], [(2 / 3) / s, (-1 / 3) / s, 0.0, (-1 / 3) / s])
    assert adv[0, 2].item() == 0.0
    assert torch.equal(adv[1], torch.zeros(4))  # one valid entry: no baseline, advantage 0
    close(rloo_advantages(rewards, valid)[0], [1.0, -0.5, 0.0, -0.5])
    assert torch.equal(rloo_advantages(rewards, valid)[1], torch.zeros(4))


def test_rft_is_indicator():
    correct = torch.tensor([[True, False], [False, False]])
    assert torch.equal(rft_advantages(correct), torch.tensor([[1.0, 0.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="bool"):
        rft_advantages(correct.float())


def test_outcome_estimators_share_one_signature_and_differ():
    assert set(OUTCOME_ESTIMATORS) == {"grpo", "dr_grpo", "rloo", "online_rft", "batch_std", "batch_reward_std"}
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    valid = torch.ones_like(rewards, dtype=torch.bool)
    outs = {name: fn(rewards, valid, std="unbiased", eps=1e-4) for name, fn in OUTCOME_ESTIMATORS.items()}
    for out in outs.values():
        assert out.shape == rewards.shape
    for a, b in itertools.combinations(outs, 2):
        assert not torch.allclose(outs[a], outs[b]), f"{a} behaves like {b}"
    close(outs["grpo"], grpo_advantages(rewards))
    close(outs["dr_grpo"], grpo_advantages(rewards, scale="none"))
    close(outs["batch_std"], grpo_advantages(rewards, scale="batch"))
    close(outs["batch_reward_std"], grpo_advantages(rewards, scale="batch_reward"))
    close(outs["rloo"], rloo_advantages(rewards))
    close(outs["online_rft"], rewards)
    signed = torch.tensor([[1.0, -1.0]])
    close(OUTCOME_ESTIMATORS["online_rft"](signed, torch.tensor([[True, True]])), [[1.0, 0.0]])
    close(
        OUTCOME_ESTIMATORS["online_rft"](rewards[:1], torch.tensor([[False, True, True, True]])), [[0.0] * 4]
    )


def test_outcome_input_checks():
    with pytest.raises(ValueError, match=r"\[P, G\]"):
        grpo_advantages(torch.zeros(4))
    with pytest.raises(ValueError, match="valid"):
        grpo_advantages(R, valid=torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="scale"):
        grpo_advantages(R, scale="global")
    with pytest.raises(ValueError, match="std"):
        grpo_advantages(R, std="bessel")


# --- process supervision -------------------------------------------------------------------------


def test_process_worked_example():
    # G = 2. Output 1: steps (t0,t1)=1 and (t2,t3)=0, then padding. Output 2: step (t0)=1, step (t1,t2)=1.
    step_rewards = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0, 0.0]])
    ends = torch.tensor([[False, True, False, True, False], [True, False, True, False, False]])
    mask = torch.tensor([[True, True, True, True, False], [True, True, True, False, False]])
    adv = grpo_process_advantages(step_rewards, ends, mask, num_generations=2, std="population", eps=0.0)
    a, b = 1 / 3**0.5, 3**0.5  # 0.577, 1.732
    close(adv, [[a - b, a - b, -b, -b, 0.0], [2 * a, a, a, 0.0, 0.0]])
    close(adv, [[-1.155, -1.155, -1.732, -1.732, 0], [1.155, 0.577, 0.577, 0, 0]], atol=1e-3, rtol=0)
    unbiased = grpo_process_advantages(step_rewards, ends, mask, num_generations=2, std="unbiased", eps=0.0)
    close(unbiased, adv * (3 / 4) ** 0.5)


def _process_reference(step_rewards, ends, mask, g, std, eps):
    n, t = step_rewards.shape
    out = torch.zeros(n, t, dtype=torch.float64)
    for p in range(n // g):
        rows = range(p * g, p * g + g)
        pooled = [step_rewards[i, j].item() for i in rows for j in range(t) if ends[i, j]]
        mean = sum(pooled) / len(pooled)
        dof = len(pooled) - (1 if std == "unbiased" else 0)
        sd = (sum((x - mean) ** 2 for x in pooled) / dof) ** 0.5
        for i in rows:
            for tok in range(t):
                if mask[i, tok]:
                    later = [j for j in range(tok, t) if ends[i, j]]
                    out[i, tok] = sum((step_rewards[i, j].item() - mean) / (sd + eps) for j in later)
    return out


@pytest.mark.parametrize("std", ["unbiased", "population"])
def test_process_matches_reference_loop(std):
    g = torch.Generator().manual_seed(4)
    p, G, t = 3, 3, 7
    n = p * G
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    mask = torch.arange(t) < lengths[:, None]
    ends = (torch.rand(n, t, generator=g) < 0.35) & mask
    ends[torch.arange(n), lengths - 1] = True
    step_rewards = torch.rand(n, t, dtype=torch.float64, generator=g)
    adv = grpo_process_advantages(step_rewards, ends, mask, num_generations=G, std=std, eps=1e-4)
    close(adv, _process_reference(step_rewards, ends, mask, G, std, 1e-4))


def test_process_input_checks():
    mask = torch.ones(4, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="multiple"):
        grpo_process_advantages(torch.zeros(4, 3), mask, mask, num_generations=3)
    with pytest.raises(ValueError, match="outside"):
        grpo_process_advantages(
            torch.zeros(2, 3),
            torch.ones(2, 3, dtype=torch.bool),
            torch.tensor([[True, True, False]] * 2),
            num_generations=2,
        )
    with pytest.raises(ValueError, match="step_end_mask"):
        grpo_process_advantages(torch.zeros(2, 3), mask[:2].float(), mask[:2], num_generations=2)


# --- GAE and PPO token rewards -------------------------------------------------------------------


def test_gae_hand_three_tokens_with_padding():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 3.0]])
    values = torch.tensor([[0.5, 0.6, 0.7, 5.0]])
    mask = torch.tensor([[True, True, True, False]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.5)
    # deltas: 0.9*0.6-0.5=0.04, 0.9*0.7-0.6=0.03, 1-0.7=0.3 (V after the last token is 0)
    close(adv, [[0.04 + 0.45 * 0.165, 0.03 + 0.45 * 0.3, 0.3, 0.0]])
    close(ret, [[0.61425, 0.765, 1.0, 0.0]])


def test_gae_gamma_lambda_one_is_return_minus_value():
    rewards = torch.tensor([[0.0, 0.0, 2.0]])
    values = torch.tensor([[0.3, -0.2, 0.9]])
    adv, ret = gae_advantages(rewards, values, torch.ones(1, 3, dtype=torch.bool), gamma=1.0, lam=1.0)
    close(adv, 2.0 - values)
    close(ret, torch.full((1, 3), 2.0))


def _gae_reference(rewards, values, mask, gamma, lam):
    adv = torch.zeros_like(values)
    for i in range(values.shape[0]):
        idx = [t for t in range(values.shape[1]) if mask[i, t]]
        running, next_v = 0.0, 0.0
        for t in reversed(idx):
            delta = rewards[i, t].item() + gamma * next_v - values[i, t].item()
            running = delta + gamma * lam * running
            adv[i, t] = running
            next_v = values[i, t].item()
    return adv


@pytest.mark.parametrize("holes", [False, True])
def test_gae_matches_reference_loop(holes):
    g = torch.Generator().manual_seed(5)
    n, t = 6, 9
    rewards = torch.randn(n, t, dtype=torch.float64, generator=g)
    values = torch.randn(n, t, dtype=torch.float64, generator=g)
    lengths = torch.randint(0, t + 1, (n,), generator=g)
    mask = torch.arange(t) < lengths[:, None]
    if holes:
        mask &= torch.rand(n, t, generator=g) < 0.7
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.95, lam=0.9)
    expected = _gae_reference(rewards, values, mask, 0.95, 0.9)
    close(adv, expected)
    close(ret, torch.where(mask, expected + values, torch.zeros_like(values)))


def test_gae_shape_check():
    with pytest.raises(ValueError, match="values"):
        gae_advantages(
            torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool), gamma=1, lam=1
        )


def test_kl_shaped_token_rewards_hand_values():
    scores = torch.tensor([1.0, -0.5])
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, 0.0]])
    ref = torch.tensor([[-1.5, -2.0, -2.0], [-2.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    out = kl_shaped_token_rewards(scores, logprobs, ref, mask, beta=0.1)
    close(out, [[-0.05, 0.0, 0.1 + 1.0], [-0.1 - 0.5, 0.0, 0.0]])


def test_kl_shaped_token_rewards_checks():
    mask = torch.tensor([[True, True], [False, False]])
    with pytest.raises(ValueError, match="no counted token"):
        kl_shaped_token_rewards(torch.zeros(2), torch.zeros(2, 2), torch.zeros(2, 2), mask, beta=0.1)
    with pytest.raises(ValueError, match="scores"):
        kl_shaped_token_rewards(torch.zeros(3), torch.zeros(2, 2), torch.zeros(2, 2), mask, beta=0.1)


def test_zero_eps_never_divides_zero_by_zero():
    rewards = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    for scale in ("group", "batch"):
        adv = grpo_advantages(rewards, scale=scale, eps=0.0)
        assert torch.isfinite(adv).all() and torch.equal(adv[0], torch.zeros(2))
    flat = grpo_process_advantages(
        torch.ones(2, 2),
        torch.ones(2, 2, dtype=torch.bool),
        torch.ones(2, 2, dtype=torch.bool),
        num_generations=2,
        eps=0.0,
    )
    assert torch.equal(flat, torch.zeros(2, 2))


@pytest.mark.parametrize(
    ("name", "expected"),
    [  # log-ratios x = logprobs - ref: row 0 [0.5, 0, -1], row 1 [1]; beta 0.1; score at the last counted token
        ("k1", [[-0.05, 0.0, 0.1 + 1.0], [-0.1 - 0.5, 0.0, 0.0]]),
        ("k2", [[-0.0125, 0.0, -0.05 + 1.0], [-0.05 - 0.5, 0.0, 0.0]]),  # 0.5 x^2
        ("abs", [[-0.05, 0.0, -0.1 + 1.0], [-0.1 - 0.5, 0.0, 0.0]]),  # |x|
        # k3 = e^y - y - 1 with y = -x: e^-0.5 - 0.5 = 0.10653066, e - 2 = 0.71828183, e^-1 = 0.36787944
        ("k3", [[-0.010653066, 0.0, -0.071828183 + 1.0], [-0.036787944 - 0.5, 0.0, 0.0]]),
    ],
)
def test_kl_in_the_reward_uses_the_chosen_estimator(name, expected):
    from grpolab.algo.kl import KL_ESTIMATORS

    scores = torch.tensor([1.0, -0.5])
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, 0.0]])
    ref = torch.tensor([[-1.5, -2.0, -2.0], [-2.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    out = kl_shaped_token_rewards(scores, logprobs, ref, mask, beta=0.1, kl_fn=KL_ESTIMATORS[name])
    close(out, expected)
