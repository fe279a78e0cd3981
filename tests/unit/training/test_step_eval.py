"""TRL's eval loss (training/step.py ``evaluation_loss``): the loss of a batch at the weights that sampled it,
ratio 1, the whole batch one optimizer step, with hand-computed values."""

from __future__ import annotations

import pytest
import torch

from grpolab.algo.kl import kl_k3
from grpolab.config import load_config
from grpolab.runtime.step_spec import logprob_context, policy_loss_spec
from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model
from grpolab.training.logprobs import completion_logprobs
from grpolab.training.step import evaluation_loss
from grpolab.types import RolloutBatch

LENGTHS = torch.tensor([5, 2, 3, 1])
ADV = torch.tensor([1.0, -1.0, 0.5, -0.5])


def _setup(ref_logprobs=None):
    tok = build_char_tokenizer()
    prompts = [tok("12+3=")["input_ids"], tok("7=")["input_ids"]]
    rows = [prompts[i] for i in (0, 0, 1, 1)]
    ids = torch.randint(4, 60, (4, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.arange(5) < LENGTHS[:, None]
    batch = RolloutBatch(rows, ids, mask, mask, ADV[:, None] * mask, ref_logprobs=ref_logprobs)
    return build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=1), batch


def _loss(model, batch, overrides):
    cfg = load_config(None, ["train.micro_batch_size=1", *overrides])  # micro-batches of one row: totals normalise
    return evaluation_loss(model, batch, logprob_context(cfg, pad_id=0, autocast_dtype=None, device_type="cpu"),
                           policy_loss_spec(cfg))  # fmt: skip


@pytest.mark.parametrize(
    ("agg", "want"),
    [
        ("seq-mean-token-mean", 0.0),  # mean over rows of -A: the advantages sum to 0
        ("token-mean", -(5 - 2 + 1.5 - 0.5) / 11),  # -sum A_i |o_i| / 11 tokens
        ("seq-mean-token-sum-norm", -(5 - 2 + 1.5 - 0.5) / (4 * 5)),  # / (rows x max_completion_length 5)
        ("batch-token-mean", -(5 - 2 + 1.5 - 0.5) / 11),  # the eval batch is bnpo's one batch: token-mean
    ],
)
def test_the_policy_term_at_ratio_one_is_minus_the_advantage_aggregated(agg, want):
    model, batch = _setup()
    rows = ["algo.loss_agg_batch_rows=2"] if agg == "batch-token-mean" else []
    got = _loss(model, batch, ["algo.beta=0", f"algo.loss_agg={agg}", "rollout.max_completion_length=5", *rows])
    assert got == pytest.approx(want, abs=1e-6)


def test_the_kl_and_the_entropy_bonus_enter_as_in_training():
    model, batch = _setup()
    lp, entropy = completion_logprobs(model, batch.prompt_ids, batch.completion_ids, batch.completion_mask,
                                      pad_id=0, with_entropy=True)  # fmt: skip
    ref = lp - 0.3 * batch.completion_mask  # a reference 0.3 nats below on every counted token
    model, batch = _setup(ref_logprobs=ref)
    mask = batch.loss_mask
    kl = kl_k3(lp, ref)  # k3 of a 0.3 gap: e^-0.3 + 0.3 - 1 per token
    want_kl = float(((kl * mask).sum(-1) / mask.sum(-1)).mean())  # grpo: mean over rows of each row's mean
    assert want_kl == pytest.approx(torch.exp(torch.tensor(-0.3)).item() + 0.3 - 1, rel=1e-5)
    got = _loss(model, batch, ["algo.beta=0.1", "algo.entropy_coef=0.2"])
    want = 0.1 * want_kl - 0.2 * float(entropy[mask].mean())  # the policy term is 0 (the advantages sum to 0)
    assert got == pytest.approx(want, rel=1e-4, abs=1e-6)
