"""The train step's token selection: the off-policy sequence mask (algo.off_policy_mask_threshold), the
80/20 high-entropy mask (algo.top_entropy_quantile), and SAPO's and VESPO's losses in the step, with
hand-computed gradients."""

import copy
import math

import pytest
import torch

from grpolab.config import Config, OptimConfig, TrainConfig, load_config, preset_algo
from grpolab.runtime.step_spec import logprob_context, policy_loss_spec, update_spec
from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model
from grpolab.training.logprobs import completion_logprobs
from grpolab.training.step import _high_entropy_tokens, _summarise, policy_loss, update_policy
from grpolab.types import RolloutBatch

MASK = torch.tensor([[True, True], [True, False]])
OLD = torch.log(torch.tensor([[0.6, 0.3], [0.5, 1.0]]))
ADV = torch.tensor([[1.0, 1.0], [-1.0, 0.0]])


def _loss(overrides, sampler, *, token_keep=None, entropy=None, lp=OLD):
    cfg = load_config(None, ["algo.beta=0", "algo.loss_agg=token-mean", *overrides])
    batch = RolloutBatch([[1], [1]], torch.zeros(2, 2, dtype=torch.long), MASK, MASK, ADV, sampler_logprobs=sampler)
    lp = lp.clone().requires_grad_(True)
    loss, stats = policy_loss(
        lp, OLD, batch, policy_loss_spec(cfg), total_seqs=2, total_tokens=3, entropy=entropy,
        token_keep=token_keep,
    )  # fmt: skip
    loss.backward()
    return float(loss.detach()), lp.grad, stats


def test_off_policy_mask_drops_the_drifted_negative_row_from_the_policy_loss():
    # row 1 (A = -1): sampler log 1.0 = 0 against the policy's log 0.5: 0.693 nats > 0.5, dropped;
    # row 0 drifted too (log(0.9 / 0.6) = 0.405 per token) but its advantage is positive: kept
    sampler = torch.log(torch.tensor([[0.9, 0.45], [1.0, 1.0]]))
    _, grad, stats = _loss(["algo.off_policy_mask_threshold=0.5"], sampler)
    torch.testing.assert_close(grad, torch.tensor([[-1 / 3, -1 / 3], [0.0, 0.0]]))  # token-mean over all 3
    assert stats["off_policy_masked"] == 1.0
    out = _summarise({**stats, "loss": 0.0, "grad_norm": 0.0, "entropy": 0.0}, {"tokens": 3.0, "updates": 1, "skipped": 0}, _Sched())
    assert out["loss/off_policy_masked_frac"] == pytest.approx(1 / 3)
    _, grad, stats = _loss(["algo.off_policy_mask_threshold=0.7"], sampler)  # 0.693 <= 0.7: kept
    torch.testing.assert_close(grad, torch.tensor([[-1 / 3, -1 / 3], [1 / 3, 0.0]]))
    assert stats["off_policy_masked"] == 0.0


def test_off_policy_mask_keeps_the_kl_term_of_a_dropped_row():
    sampler = torch.log(torch.tensor([[0.6, 0.3], [1.0, 1.0]]))
    ref = torch.log(torch.tensor([[0.6, 0.3], [0.25, 1.0]]))
    cfg = load_config(None, ["algo.beta=0.5", "algo.loss_agg=token-mean", "algo.off_policy_mask_threshold=0.5"])
    batch = RolloutBatch([[1], [1]], torch.zeros(2, 2, dtype=torch.long), MASK, MASK, ADV, ref_logprobs=ref,
                         sampler_logprobs=sampler)  # fmt: skip
    lp = OLD.clone().requires_grad_(True)
    loss, _ = policy_loss(lp, OLD, batch, policy_loss_spec(cfg), total_seqs=2, total_tokens=3)
    loss.backward()
    # k3 = exp(ref - lp) - (ref - lp) - 1; d/dlp = 1 - exp(ref - lp) = 1 - 0.5 at row 1; times beta / 3 tokens
    torch.testing.assert_close(lp.grad[1], torch.tensor([0.5 * 0.5 / 3, 0.0]))


def test_token_keep_limits_the_policy_loss_and_the_entropy_bonus():
    keep = torch.tensor([[False, True], [True, False]])
    entropy = torch.tensor([[1.0, 2.0], [3.0, 9.0]], requires_grad=True)
    loss, grad, _ = _loss(["algo.entropy_coef=0.1"], OLD, token_keep=keep, entropy=entropy)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -1 / 3], [1 / 3, 0.0]]))
    torch.testing.assert_close(entropy.grad, torch.tensor([[0.0, -0.1 / 3], [-0.1 / 3, 0.0]]))
    # ratio 1: policy terms -A = -1 (kept), +1 (kept); bonus -0.1 * (2 + 3); token-mean over 3
    assert loss == pytest.approx((-1.0 + 1.0 - 0.1 * 5) / 3)


def test_sapo_in_the_step_gates_instead_of_clipping():
    lp = OLD + math.log(2.0)  # ratio 2 on every token
    _, grad, stats = _loss(["algo.policy_loss=sapo", "algo.mu=2"], OLD, lp=lp)
    s_pos, s_neg = 1 / (1 + math.exp(-1.0)), 1 / (1 + math.exp(-1.05))
    g_pos, g_neg = 4 * s_pos * (1 - s_pos) * 2, 4 * s_neg * (1 - s_neg) * 2  # d/dlogp of the gate, times the ratio
    torch.testing.assert_close(grad, torch.tensor([[-g_pos / 3, -g_pos / 3], [g_neg / 3, 0.0]]))
    assert stats["clip_frac_low"] == stats["clip_frac_high"] == 0.0


def test_vespo_folds_the_rollout_weights_into_its_sequence_weight():
    # trainer 0.6 / 0.3 against the sampler's 0.2 / 0.4: TIS token weights min(3, 2) = 2 and 0.75, row 0's w =
    # 1.5 (ratio 1); A >= 0: phi(1.5) = 1.5^2 e^{3 (1 - 1.5)}. Row 1 (sampler = trainer): w = 1, phi = 1
    sampler = torch.log(torch.tensor([[0.2, 0.4], [0.5, 1.0]]))
    overrides = ["algo.policy_loss=vespo", "algo.rollout_correction=tis", "algo.mu=2"]
    _, grad, stats = _loss(overrides, sampler)
    phi = 1.5**2 * math.exp(3 * (1 - 1.5))
    torch.testing.assert_close(grad, torch.tensor([[-phi / 3, -phi / 3], [1 / 3, 0.0]]))  # not times the weights
    assert stats["rollout_weight"] == pytest.approx(2 + 0.75 + 1)


class _Sched:
    def get_last_lr(self):
        return [0.0]


def _tiny_batch():
    tok = build_char_tokenizer()
    prompts = [tok("12+3=")["input_ids"], tok("7=")["input_ids"]]
    rows = [prompts[i] for i in (0, 0, 0, 1, 1, 1)]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 60, (6, 9), generator=gen)
    mask = torch.arange(9) < torch.tensor([9, 2, 6, 4, 7, 1])[:, None]
    advantages = torch.tensor([1.0, -0.5, -0.5, 0.8, -0.4, -0.4])[:, None] * mask
    return tok, RolloutBatch(rows, ids, mask, mask, advantages, old_logprobs=-torch.rand(6, 9, generator=gen) * mask)


def _cfg(micro: int, rho: float) -> Config:
    algo = preset_algo("grpo", beta=0.0, top_entropy_quantile=rho)
    return Config(optim=OptimConfig(lr=1.0, max_grad_norm=0.0), algo=algo,
                  train=TrainConfig(prompts_per_step=2, micro_batch_size=micro))  # fmt: skip


def test_the_entropy_threshold_spans_the_minibatch_whatever_the_micro_batches():
    tok, batch = _tiny_batch()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=3)
    _, entropy = completion_logprobs(model, batch.prompt_ids, batch.completion_ids, batch.completion_mask,
                                     pad_id=0, with_entropy=True)  # fmt: skip
    threshold = torch.quantile(entropy[batch.loss_mask], 1 - 0.2)  # TRL's get_high_entropy_mask, one process
    want = (entropy >= threshold) & batch.loss_mask
    for micro in (1, 4, 64):
        cfg = _cfg(micro, 0.2)
        micros = [torch.arange(6)[i : i + micro] for i in range(0, 6, micro)]
        ctx = logprob_context(cfg, pad_id=0, autocast_dtype=None, device_type="cpu")
        keeps = _high_entropy_tokens(model, batch, micros, ctx, policy_loss_spec(cfg))
        got = torch.zeros_like(want)
        for rows, keep in zip(micros, keeps, strict=True):
            got[rows] = keep
        assert torch.equal(got, want), micro
    assert int(want.sum()) == 6  # 29 counted tokens: the 0.8 quantile sits at rank 22.4, so ranks 23..28 are kept


def test_an_update_with_the_entropy_mask_does_not_depend_on_the_micro_batch_size():
    tok, batch = _tiny_batch()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=3)
    deltas = {}
    for micro, rho in ((64, 0.2), (1, 0.2), (64, 1.0)):
        m = copy.deepcopy(model)
        sgd = torch.optim.SGD(m.parameters(), lr=1.0)
        before = [p.detach().clone() for p in m.parameters()]
        cfg = _cfg(micro, rho)
        update_policy(m, sgd, torch.optim.lr_scheduler.LambdaLR(sgd, lambda s: 1.0), batch,
                      update_spec(cfg, logprob_context(cfg, pad_id=0, autocast_dtype=None, device_type="cpu")), generator=torch.Generator().manual_seed(0))  # fmt: skip
        deltas[micro, rho] = torch.cat([(p.detach() - b).flatten() for p, b in zip(m.parameters(), before, strict=True)])
    torch.testing.assert_close(deltas[1, 0.2], deltas[64, 0.2], atol=1e-6, rtol=1e-4)
    assert (deltas[64, 0.2] - deltas[64, 1.0]).abs().max() > 1e-3  # the mask does change the update
