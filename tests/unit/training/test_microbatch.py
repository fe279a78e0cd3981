"""Token-budget micro-batches: the split, and an update that equals the one-forward update."""

from __future__ import annotations

import copy

import torch

from grpolab.config import Config, OptimConfig, TrainConfig, preset_algo
from grpolab.runtime.step_spec import logprob_context, update_spec
from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model
from grpolab.training.microbatch import split_rows
from grpolab.training.spec import LogprobContext
from grpolab.training.step import update_policy
from grpolab.types import RolloutBatch


def test_rows_are_packed_longest_first_within_the_token_budget():
    completion = torch.tensor([3, 9, 5, 1, 8, 2])
    prompt = torch.tensor([2, 1, 1, 2, 2, 1])  # totals 5, 10, 6, 3, 10, 3
    parts = split_rows(torch.arange(6), completion, 4, max_tokens=20, prompt_lengths=prompt)
    # padded size = rows x (widest prompt + longest completion): [1, 4] -> 2 x (2 + 9) = 22 > 20,
    # [4, 2] -> 2 x (2 + 8) = 20, [4, 2, 0] -> 30, [0, 3, 5] -> 3 x (2 + 3) = 15
    assert [p.tolist() for p in parts] == [[1], [4, 2], [0, 3, 5]]
    # the row cap still applies, and a row longer than the budget runs alone
    parts = split_rows(torch.arange(6), completion, 1, max_tokens=1000, prompt_lengths=prompt)
    assert all(len(p) == 1 for p in parts)
    assert [p.tolist() for p in split_rows(torch.tensor([1, 4]), completion, 8, max_tokens=3)] == [[1], [4]]


def _batch():
    tok = build_char_tokenizer()
    prompts = [tok("12+3=")["input_ids"], tok("7=")["input_ids"]]
    rows = [prompts[i] for i in (0, 0, 0, 1, 1, 1)]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 60, (6, 9), generator=gen)
    mask = torch.arange(9) < torch.tensor([9, 2, 6, 4, 7, 1])[:, None]
    advantages = torch.tensor([1.0, -0.5, -0.5, 0.8, -0.4, -0.4])[:, None] * mask
    old = -torch.rand(6, 9, generator=gen) * mask
    return tok, RolloutBatch(rows, ids, mask, mask, advantages, old_logprobs=old, ref_logprobs=old - 0.1)


def _one_update(model, batch, cfg):
    sgd = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(sgd, lambda s: 1.0)
    before = [p.detach().clone() for p in model.parameters()]
    metrics = update_policy(
        model, sgd, scheduler, batch, update_spec(cfg, logprob_context(cfg, pad_id=0, autocast_dtype=None, device_type="cpu")),
        generator=torch.Generator().manual_seed(0),
    )
    return metrics, [p.detach() - b for p, b in zip(model.parameters(), before, strict=True)]


def test_token_budget_update_equals_the_one_forward_update():
    tok, batch = _batch()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=3)
    for name in ("grpo", "dapo"):  # sequence- and token-level normalisers
        base = {"optim": OptimConfig(lr=1.0, max_grad_norm=0.0), "algo": preset_algo(name, num_minibatches=1)}
        whole = Config(**base, train=TrainConfig(prompts_per_step=3, micro_batch_size=64))
        split = Config(**base, train=TrainConfig(prompts_per_step=3, micro_batch_size=64, max_tokens_per_micro_batch=24))
        want_metrics, want = _one_update(copy.deepcopy(model), batch, whole)
        got_metrics, got = _one_update(copy.deepcopy(model), batch, split)
        assert abs(got_metrics["loss"] - want_metrics["loss"]) < 1e-6
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_reference_logprobs_in_token_budget_micro_batches_keep_row_order():
    tok, batch = _batch()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=4)
    args = (model, batch.prompt_ids, batch.completion_ids, batch.completion_mask)
    want = LogprobContext(0, 1.0, None, 64).logprobs(*args)
    got = LogprobContext(0, 1.0, None, 64, max_tokens=20).logprobs(*args)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _on(batch: RolloutBatch, device: str) -> RolloutBatch:
    return RolloutBatch(
        batch.prompt_ids, *(t.to(device) for t in (batch.completion_ids, batch.completion_mask, batch.loss_mask, batch.advantages)),
        old_logprobs=batch.old_logprobs.to(device), ref_logprobs=batch.ref_logprobs.to(device),
    )  # fmt: skip


def test_the_plan_is_made_on_the_host_and_the_rows_taken_on_the_batch_device():
    """The meta device stands in for CUDA: the minibatch shuffle is a CPU generator's, the batch lives on
    the accelerator. Indexing the CPU rows with device indices raised IndexError on CUDA; the plan is
    now made from host lengths (one copy) and each micro-batch's index moves to the batch's device once."""
    from grpolab.training.microbatch import completion_lengths_of, prompt_lengths_of
    from grpolab.training.step import minibatch_order

    _, host = _batch()
    device = _on(host, "meta")
    rows = minibatch_order(6, 1, torch.Generator().manual_seed(0))[0]
    lengths = completion_lengths_of(host.completion_mask)  # on CUDA: the one device-to-host copy
    assert lengths.device.type == "cpu" and lengths.tolist() == [9, 2, 6, 4, 7, 1]
    for budget in ({}, {"max_tokens": 30, "prompt_lengths": prompt_lengths_of(host.prompt_ids)}):
        parts = split_rows(rows, lengths, 2, **budget)
        assert all(p.device.type == "cpu" for p in parts)
        assert sorted(torch.cat(parts).tolist()) == list(range(6))
        for part in parts:
            mb = device.select(part)
            assert mb.completion_ids.device.type == "meta" and mb.advantages.shape == (len(part), 9)
            assert mb.prompt_ids == [host.prompt_ids[i] for i in part.tolist()]
