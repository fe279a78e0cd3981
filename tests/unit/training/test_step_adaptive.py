"""The update's loss-dependent state: adaptive entropy control moves its coefficient once per optimizer step by
that step's measured entropy, and bnpo's normalising batches (algo.loss_agg=batch-token-mean) are cut from the
shuffled minibatch, not from the memory micro-batches."""

from __future__ import annotations

import copy

import pytest
import torch

from grpolab.algo.entropy_control import AdaptiveEntropy
from grpolab.config import load_config
from grpolab.runtime.step_spec import entropy_control, logprob_context, update_spec
from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model
from grpolab.training.logprobs import completion_logprobs
from grpolab.training.step import minibatch_row_norms, update_policy
from grpolab.types import RolloutBatch

LENGTHS = torch.tensor([9, 2, 6, 4, 7, 1])


def _batch():
    tok = build_char_tokenizer()
    prompts = [tok("12+3=")["input_ids"], tok("7=")["input_ids"]]
    rows = [prompts[i] for i in (0, 0, 0, 1, 1, 1)]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 60, (6, 9), generator=gen)
    mask = torch.arange(9) < LENGTHS[:, None]
    advantages = torch.tensor([1.0, -0.5, -0.5, 0.8, -0.4, -0.4])[:, None] * mask
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=3)
    return model, RolloutBatch(rows, ids, mask, mask, advantages)


def _update(model, batch, overrides, control=None):
    """One update_policy call with SGD at lr 1 on a copy of ``model``: (the copy, the weight change, metrics)."""
    m = copy.deepcopy(model)
    sgd = torch.optim.SGD(m.parameters(), lr=1.0)
    before = [p.detach().clone() for p in m.parameters()]
    cfg = load_config(None, ["algo.beta=0", "optim.max_grad_norm=0", "train.prompts_per_step=2", *overrides])
    spec = update_spec(cfg, logprob_context(cfg, pad_id=0, autocast_dtype=None, device_type="cpu"))
    out = update_policy(m, sgd, torch.optim.lr_scheduler.LambdaLR(sgd, lambda s: 1.0), batch, spec,
                        generator=torch.Generator().manual_seed(0), entropy_control=control)  # fmt: skip
    delta = torch.cat([(p.detach() - b).flatten() for p, b in zip(m.parameters(), before, strict=True)])
    return m, delta, out


def test_adaptive_control_gates_the_first_step_and_moves_once_per_optimizer_step():
    model, batch = _batch()
    adaptive = ["algo.entropy_adaptive=true", "algo.entropy_coef=0.5", "algo.entropy_target=15", "algo.entropy_coef_delta=0.25"]
    control = entropy_control(load_config(None, adaptive))
    assert control == AdaptiveEntropy(coef=0.5, target=15.0, delta=0.25, coef_min=0.0, coef_max=1.0)
    _, entropy = completion_logprobs(model, batch.prompt_ids, batch.completion_ids, batch.completion_mask,
                                     pad_id=0, with_entropy=True)  # fmt: skip
    moved, delta, out = _update(model, batch, adaptive, control)
    # step 1 applies no bonus (no entropy measured yet): the update without one
    torch.testing.assert_close(delta, _update(model, batch, [])[1], atol=1e-7, rtol=0)
    assert control.last_entropy == pytest.approx(float(entropy[batch.loss_mask].mean()), rel=1e-5)
    assert (control.coef, out["entropy_coef"]) == (0.75, 0.75) and "policy_loss" in out  # 0.5 + 0.25, logged
    assert out["loss/entropy_coef_next"] == 0.75  # the entropy was at or below the target: applied next step
    # step 2 applies the coefficient the first step left: the static bonus of 0.75 from the same weights
    _, delta2, _ = _update(moved, batch, adaptive, control)
    torch.testing.assert_close(delta2, _update(moved, batch, ["algo.entropy_coef=0.75"])[1], atol=1e-7, rtol=0)
    assert control.coef == 1.0  # 0.75 + 0.25, at coef_max
    # two minibatches: two optimizer steps, two moves
    control = entropy_control(load_config(None, adaptive))
    _update(model, batch, [*adaptive, "algo.num_minibatches=2"], control)
    assert control.coef == 1.0


def test_bnpo_batches_are_cut_from_the_shuffled_minibatch_whatever_the_micro_batches():
    model, batch = _batch()
    norms = minibatch_row_norms(batch, torch.arange(6), 3, torch.Generator().manual_seed(0))
    # two batches of 3 rows: each row's divisor is 2 x its batch's tokens, and the two batches hold all 29
    sums = sorted({float(n) / 2 for n in norms})
    assert len(sums) == 2 and sum(sums) == 29
    for value in sums:
        rows = norms == 2 * value
        assert int(rows.sum()) == 3 and int(LENGTHS[rows].sum()) == value
    assert minibatch_row_norms(batch, torch.arange(6), None, torch.Generator()) is None  # the other modes
    bnpo = ["algo.loss_agg=batch-token-mean", "algo.loss_agg_batch_rows=3"]
    _, by_row, out = _update(model, batch, [*bnpo, "train.micro_batch_size=1"])
    _, whole, _ = _update(model, batch, [*bnpo, "train.micro_batch_size=64"])
    torch.testing.assert_close(by_row, whole, atol=1e-6, rtol=1e-4)
    # and it is not dapo's token-mean, whose divisor is the step's 29 tokens
    assert (whole - _update(model, batch, ["algo.loss_agg=token-mean"])[1]).abs().max() > 1e-4
