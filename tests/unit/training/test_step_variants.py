"""The train step's new terms: rollout correction, sampler mismatch metrics, CISPO, entropy bonus."""

import math

import pytest
import torch

from grpolab.config import load_config
from grpolab.runtime.step_spec import policy_loss_spec
from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model
from grpolab.training.logprobs import completion_logprobs
from grpolab.training.step import _summarise, policy_loss
from grpolab.types import RolloutBatch

MASK = torch.tensor([[True, True], [True, False]])
OLD = torch.log(torch.tensor([[0.6, 0.3], [0.5, 1.0]]))
SAMPLER = torch.log(torch.tensor([[0.2, 0.4], [0.5, 1.0]]))  # token weights 3, 0.75, 1


def _batch(sampler=SAMPLER):
    return RolloutBatch(
        prompt_ids=[[1], [1]],
        completion_ids=torch.zeros(2, 2, dtype=torch.long),
        completion_mask=MASK,
        loss_mask=MASK,
        advantages=torch.tensor([[1.0, 1.0], [-1.0, 0.0]]),
        sampler_logprobs=sampler,
    )


def _loss(overrides, entropy=None, sampler=SAMPLER):
    cfg = load_config(None, ["algo.beta=0", "algo.loss_agg=token-mean", *overrides])
    lp = OLD.clone().requires_grad_(True)  # ratio 1: the trainer's own old log-probs
    loss, stats = policy_loss(
        lp, OLD, _batch(sampler), policy_loss_spec(cfg), total_seqs=2, total_tokens=3, entropy=entropy
    )
    loss.backward()
    return float(loss.detach()), lp.grad, stats


def test_mismatch_is_measured_every_step_even_without_correction():
    _, grad, stats = _loss([])
    assert stats["sampler_abs_diff"] == pytest.approx(math.log(3) + abs(math.log(0.75)), abs=1e-5)
    assert stats["sampler_kl"] > 0
    # REINFORCE at ratio 1, token-mean over 3 tokens: d loss / d logp = -A / 3
    torch.testing.assert_close(grad, torch.tensor([[-1 / 3, -1 / 3], [1 / 3, 0.0]]))
    sums = {**stats, "loss": 0.0, "grad_norm": 0.0, "entropy": 0.0}
    out = _summarise(sums, {"tokens": 3.0, "updates": 1, "skipped": 0}, _Sched())
    assert out["sampling/sampling_logp_difference/mean"] == pytest.approx(stats["sampler_abs_diff"] / 3)
    _, _, same = _loss([], sampler=OLD)
    assert same["sampler_abs_diff"] == 0.0 and same["sampler_kl"] == 0.0


@pytest.mark.parametrize(
    ("mode", "level", "weights"),
    [
        ("tis", "token", [[2.0, 0.75], [1.0, 0.0]]),
        ("mis", "token", [[0.0, 0.75], [1.0, 0.0]]),
        ("tis", "sequence", [[2.0, 2.0], [1.0, 0.0]]),  # row 0: 3 * 0.75 = 2.25, capped at 2
    ],
)
def test_rollout_correction_scales_each_tokens_gradient(mode, level, weights):
    _, grad, stats = _loss([f"algo.rollout_correction={mode}", f"algo.rollout_correction_level={level}"])
    w = torch.tensor(weights)
    torch.testing.assert_close(grad, -w * torch.tensor([[1.0, 1.0], [-1.0, 0.0]]) / 3)
    assert stats["rollout_weight"] == pytest.approx(float(w.sum()))


def test_cispo_in_the_step_differs_from_the_clip_loss_off_policy():
    cfg = load_config(None, ["algo.name=cispo", "train.prompts_per_step=16", "algo.clip_high=0.5"])
    lp = (OLD + torch.log(torch.tensor(2.0))).requires_grad_(True)  # ratio 2 on every token
    loss, _ = policy_loss(lp, OLD, _batch(), policy_loss_spec(cfg), total_seqs=2, total_tokens=3)
    loss.backward()
    # weight clip(2, 0, 1.5) = 1.5 on every counted token, token-mean over 3
    torch.testing.assert_close(lp.grad, torch.tensor([[-0.5, -0.5], [0.5, 0.0]]))


def test_entropy_bonus_enters_the_loss_with_its_gradient():
    entropy = torch.tensor([[1.0, 2.0], [3.0, 9.0]], requires_grad=True)
    base, _, _ = _loss([])
    with_bonus, _, stats = _loss(["algo.entropy_coef=0.1"], entropy=entropy)
    assert with_bonus - base == pytest.approx(-0.1 * (1 + 2 + 3) / 3)  # token-mean of the counted entropy
    torch.testing.assert_close(entropy.grad, torch.tensor([[-0.1 / 3, -0.1 / 3], [-0.1 / 3, 0.0]]))
    assert stats["policy_loss"] == pytest.approx(base, abs=1e-6)  # TRL's policy_loss: the loss without the bonus
    assert "policy_loss" not in _loss([])[2]


@pytest.mark.parametrize("agg", ["seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_the_entropy_bonus_is_the_mean_per_token_entropy_whatever_the_loss_aggregation(agg):
    """TRL: L = L_policy - coef * H with H the mean per-token entropy, not normalised like the policy term."""
    entropy = torch.tensor([[1.0, 2.0], [3.0, 9.0]])
    base, _, _ = _loss([f"algo.loss_agg={agg}"])
    with_bonus, _, stats = _loss([f"algo.loss_agg={agg}", "algo.entropy_coef=0.1"], entropy=entropy)
    assert with_bonus - base == pytest.approx(-0.1 * (1 + 2 + 3) / 3)
    assert stats["policy_loss"] == pytest.approx(base, abs=1e-6)


def test_entropy_has_a_graph_only_when_asked():
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    args = (model, [tok("1+2=")["input_ids"]], torch.tensor([[3, 2]]), torch.ones(1, 2, dtype=torch.bool))
    _, plain = completion_logprobs(*args, pad_id=0, with_entropy=True)
    _, graph = completion_logprobs(*args, pad_id=0, with_entropy=True, entropy_grad=True)
    assert not plain.requires_grad and graph.requires_grad
    torch.testing.assert_close(plain, graph.detach())


class _Sched:
    def get_last_lr(self):
        return [0.0]


def test_the_step_summary_uses_trls_names():
    sums = {"loss": 0.6, "grad_norm": 1.5, "entropy": 2.0, "clip_frac_low": 1.0, "clip_frac_high": 2.0, "kl": 0.4}
    out = _summarise(sums, {"tokens": 4.0, "updates": 3, "skipped": 0}, _Sched())
    # loss per optimizer step (3 steps), token means over 4 tokens, grad_norm per applied update
    assert out["loss"] == pytest.approx(0.2) and out["grad_norm"] == pytest.approx(0.5)
    assert (out["clip_ratio/low_mean"], out["clip_ratio/high_mean"]) == (0.25, 0.5)
    assert out["clip_ratio/region_mean"] == 0.75  # TRL: low or high (they never overlap: opposite advantages)
    assert (out["entropy"], out["kl"]) == (0.5, 0.1) and out["learning_rate"] == _Sched().get_last_lr()[0]
    assert "policy_loss" not in out
    assert _summarise({**sums, "policy_loss": 0.9}, {"tokens": 4.0, "updates": 3, "skipped": 0}, _Sched())["policy_loss"] == pytest.approx(0.3)
