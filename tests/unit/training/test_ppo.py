"""PPO's batch: the advantages that reach the loss, pinned to a hand computation on a tiny fixed case."""

from __future__ import annotations

import contextlib
import math
import statistics

import pytest
import torch

from grpolab.algo.kl import kl_k1, kl_k2, kl_k3
from grpolab.config import ConfigError, load_config
from grpolab.runtime.step_spec import batch_builder, policy_loss_spec
from grpolab.training.batch import build_rollout_batch
from grpolab.training.ppo import build_ppo_batch
from grpolab.training.step import policy_loss
from grpolab.types import Completions

# P = 1 prompt, G = 2 completions, T = 3; the second completion has 2 counted tokens.
MASK = torch.tensor([[True, True, True], [True, True, False]])
SAMPLED = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, 0.0]])
REF = torch.tensor([[-1.5, -2.0, -1.0], [-0.5, -1.0, 0.0]])
VALUES = torch.tensor([[0.5, 0.4, 0.8], [0.2, -0.1, 0.0]])
REWARDS = torch.tensor([[1.0, 0.0]])  # [P, G]

# beta = 0.1: k1 = SAMPLED - REF = [[0.5, 0, 0.5], [-0.5, 0]], so r_t = -0.1 * k1 (+ the score at the end)
TOKEN_REWARDS = [[-0.05, 0.0, 0.95], [0.05, 0.0, 0.0]]
# gamma = 0.9, lam = 0.5 (gamma * lam = 0.45), V = 0 after the last counted token:
#   row 0: t2: 0.95 - 0.8 = 0.15;  t1: 0 + 0.9*0.8 - 0.4 + 0.45*0.15 = 0.3875;  t0: -0.05 + 0.9*0.4 - 0.5 + 0.45*0.3875
#   row 1: t1: 0 - (-0.1) = 0.1;   t0: 0.05 + 0.9*(-0.1) - 0.2 + 0.45*0.1
GAE = [[-0.015625, 0.3875, 0.15], [-0.195, 0.1, 0.0]]
RETURNS = [[0.484375, 0.7875, 0.95], [0.005, 0.0, 0.0]]


class _FixedCritic:
    def values(self, prompt_ids, completion_ids, completion_mask):
        return VALUES.clone()


class _FixedContext:
    """Stands in for LogprobContext: the reference log-probs are REF."""

    def logprobs(self, model, prompt_ids, completion_ids, completion_mask):
        return REF.clone()


class _Reference:
    @contextlib.contextmanager
    def model(self):
        yield None


def _completions(mask=MASK) -> Completions:
    return Completions(
        prompt_ids=[[5, 6], [5, 6]],
        completion_ids=torch.tensor([[7, 8, 2], [9, 2, 0]]),
        completion_mask=mask,
        logprobs=SAMPLED.clone(),
        texts=["ab", "c"],
        finish_reasons=["stop", "stop"],
        num_generations=2,
    )


def _cfg(*overrides):
    base = ["algo.name=ppo", "algo.beta=0.1", "rollout.num_generations=2", "train.prompts_per_step=1", "algo.num_minibatches=1"]
    return load_config(None, [*base, *overrides])


def _batch(cfg, valid=None):
    valid = torch.ones_like(REWARDS, dtype=torch.bool) if valid is None else valid
    return batch_builder(cfg, _FixedContext(), _FixedCritic())(
        _completions(), [[5, 6]], REWARDS, valid, policy=None, reference=_Reference()
    )


def test_ppo_advantages_reaching_the_loss_match_a_hand_computation():
    cfg = _cfg("algo.gamma=0.9", "algo.lam=0.5", "algo.whiten_advantages=false")
    batch, metrics = _batch(cfg)
    torch.testing.assert_close(batch.advantages, torch.tensor(GAE))
    torch.testing.assert_close(batch.returns, torch.tensor(RETURNS))
    torch.testing.assert_close(batch.old_values, VALUES)
    assert batch.old_logprobs is None and torch.equal(batch.ref_logprobs, REF)
    assert metrics["kl"] == pytest.approx((0.5 + 0 + 0.5 - 0.5 + 0) / 5)
    # At ratio 1 the surrogate is -A per token; PPO's preset aggregates as DeepSeekMath Eq. 1: (1/|o|) sum_t.
    spec = policy_loss_spec(cfg)
    assert spec.kl is None  # the KL is in the reward, not the loss
    loss, _ = policy_loss(SAMPLED, SAMPLED, batch, spec, total_seqs=2.0, total_tokens=5.0)
    expected = -((-0.015625 + 0.3875 + 0.15) / 3 + (-0.195 + 0.1) / 2) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_whitening_uses_the_counted_tokens_and_gamma_lam_one_gives_return_minus_value():
    batch, _ = _batch(_cfg())  # defaults: gamma = lam = 1, whitened
    # gamma = lam = 1: A_t = score - sum_{k >= t} beta * k1_k - V(s_t)
    raw = [[1 - 0.05 - 0.05 - 0.5, 1 - 0.05 - 0.4, 1 - 0.05 - 0.8], [0 + 0.05 - 0.2, 0 + 0.1]]
    flat = [a for row in raw for a in row]
    mean, std = statistics.fmean(flat), statistics.stdev(flat)
    expected = [[(a - mean) / math.sqrt(std**2 + 1e-8) for a in row] for row in raw]
    expected[1].append(0.0)
    torch.testing.assert_close(batch.advantages, torch.tensor(expected))
    returns = [[1 - 0.05 - 0.05, 1 - 0.05, 0.95], [0.05, 0.0, 0.0]]  # unwhitened A + V
    torch.testing.assert_close(batch.returns, torch.tensor(returns))


def test_a_reward_that_does_not_apply_takes_its_completion_out_of_the_loss():
    cfg = _cfg("algo.whiten_advantages=false")
    batch, _ = _batch(cfg, valid=torch.tensor([[True, False]]))
    assert batch.loss_mask[1].sum() == 0 and torch.equal(batch.advantages[1], torch.zeros(3))
    assert batch.loss_mask[0].all()


def test_beta_zero_leaves_only_the_score_at_the_last_token():
    cfg = _cfg("algo.beta=0.0", "algo.whiten_advantages=false")
    batch, _ = batch_builder(cfg, _FixedContext(), _FixedCritic())(
        _completions(), [[5, 6]], REWARDS, torch.ones(1, 2, dtype=torch.bool), policy=None, reference=None
    )
    expected = [[1 - 0.5, 1 - 0.4, 1 - 0.8], [0 - 0.2, 0 + 0.1, 0.0]]
    torch.testing.assert_close(batch.advantages, torch.tensor(expected))


def test_the_batch_builder_is_chosen_once_from_the_config():
    grpo = batch_builder(load_config(None, []), None, None)
    assert grpo.func is build_rollout_batch and grpo.args[0].kl is kl_k3 and not grpo.args[0].kl_in_reward  # GRPO: k3 in the loss
    ppo = batch_builder(_cfg(), None, _FixedCritic())
    assert ppo.func is build_ppo_batch and isinstance(ppo.keywords["critic"], _FixedCritic)
    assert ppo.args[0].kl is kl_k1 and ppo.args[0].kl_in_reward and ppo.args[0].beta == 0.1
    assert load_config(None, ["algo.name=ppo"]).algo.needs_critic
    assert not load_config(None, ["algo.name=rloo"]).algo.needs_critic


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algo.lam=1.5", "algo.lam"),
        ("algo.gamma=-0.1", "algo.gamma"),
        ("algo.value_clip=0", "algo.value_clip"),
        ("algo.value_init=reward_model", "value_init_path"),
        ("algo.critic_warmup_steps=-1", "critic_warmup_steps"),
    ],
)
def test_bad_ppo_settings_fail_with_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        _cfg(override)


def test_ppo_advantages_put_the_configured_kl_estimator_in_the_token_rewards():
    """algo.kl_estimator reaches PPO's reward (it was k1 whatever the setting): k2 = 0.5 x^2 by hand."""
    from grpolab.training.ppo import ppo_advantages

    scores = torch.tensor([1.0])
    logprobs, ref = torch.tensor([[-1.0, -3.0]]), torch.tensor([[-1.5, -2.0]])  # x = [0.5, -1]
    mask = torch.ones(1, 2, dtype=torch.bool)
    kw = dict(beta=0.1, gamma=1.0, lam=1.0, whiten=False)
    k1 = ppo_advantages(scores, logprobs, ref, torch.zeros(1, 2), mask, mask, kl=kl_k1, **kw)
    k2 = ppo_advantages(scores, logprobs, ref, torch.zeros(1, 2), mask, mask, kl=kl_k2, **kw)
    torch.testing.assert_close(k1.token_rewards, torch.tensor([[-0.05, 0.1 + 1.0]]))
    torch.testing.assert_close(k2.token_rewards, torch.tensor([[-0.0125, -0.05 + 1.0]]))
