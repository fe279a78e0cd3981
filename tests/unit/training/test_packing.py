"""Padding-free packed micro-batches (training/packing.py) equal the left-padded path: log-probs, entropies
and gradients, with the chunked head and with the plain full-logits head; and an update_policy step with
train.padding_free equals the padded one."""

from __future__ import annotations

import copy

import pytest
import torch

from grpolab.config import Config, OptimConfig, TrainConfig, preset_algo
from grpolab.runtime.step_spec import logprob_context, update_spec
from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model
from grpolab.training import logprobs as logprobs_module
from grpolab.training.logprobs import completion_logprobs
from grpolab.training.packing import packed_completion_logprobs, packed_inputs
from grpolab.training.step import update_policy
from grpolab.types import RolloutBatch


def _rows():
    tok = build_char_tokenizer()
    prompts = [tok(p)["input_ids"] for p in ("12+3=", "7=", "100-99=")]
    rows = [prompts[i] for i in (0, 0, 1, 1, 2, 2)]
    ids = torch.randint(4, 60, (6, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.arange(7) < torch.tensor([7, 2, 5, 1, 6, 3])[:, None]
    return tok, rows, ids, mask


def test_the_packed_layout_by_hand():
    ids = torch.tensor([[10, 11, 0], [12, 0, 0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    input_ids, positions, keep, rows, cols = packed_inputs([[5, 6], [7]], ids, mask)
    assert input_ids.tolist() == [[5, 6, 10, 11, 7, 12]]
    assert positions.tolist() == [[0, 1, 2, 3, 0, 1]]  # restarting at each row: the block-diagonal mask
    assert keep.tolist() == [1, 2, 4] and rows.tolist() == [0, 0, 1] and cols.tolist() == [0, 1, 0]


@pytest.mark.parametrize("shared", [True, False], ids=["shared-prompt", "row-by-row"])
@pytest.mark.parametrize("head", ["chunked", "full-logits"])
def test_packed_logprobs_entropies_and_gradients_equal_the_padded_path(head, shared, monkeypatch):
    """With an entropy term in the loss: the shared-prompt padded forward gave the entropy of each
    completion's first token no gradient under the chunked head until this test found it."""
    tok, rows, ids, mask = _rows()
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=2, seed=1)
    if not shared:  # the padded forward row by row, not with each prompt run once
        monkeypatch.setattr(logprobs_module._Forward, "can_share_prefix", lambda self: False)
    if head == "full-logits":
        monkeypatch.setattr(logprobs_module, "_chunked_head", lambda m: None)
        monkeypatch.setattr("grpolab.training.packing._chunked_head", lambda m: None)
    weights = torch.linspace(-1, 1, ids.numel()).view_as(ids.float())
    out = {}
    for name, fn in (("padded", completion_logprobs), ("packed", packed_completion_logprobs)):
        m = copy.deepcopy(model)
        lp, ent = fn(m, rows, ids, mask, pad_id=0, temperature=0.7, with_entropy=True, entropy_grad=True)
        ((lp * weights).sum() + 0.1 * ent.sum()).backward()
        out[name] = (lp.detach(), ent.detach(), {n: p.grad for n, p in m.named_parameters()})
    (lp0, ent0, g0), (lp1, ent1, g1) = out["padded"], out["packed"]
    assert (lp1[~mask] == 0).all() and (lp1[mask] < 0).all()
    torch.testing.assert_close(lp1, lp0, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(ent1, ent0, atol=2e-5, rtol=1e-5)
    for n, g in g0.items():
        torch.testing.assert_close(g1[n], g, atol=1e-5, rtol=1e-4, msg=n)


def test_an_update_with_padding_free_micro_batches_equals_the_padded_update():
    tok, rows, ids, mask = _rows()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=2)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.2, -0.2])[:, None] * mask
    old = -torch.rand(6, 7, generator=torch.Generator().manual_seed(1)) * mask
    batch = RolloutBatch(rows, ids, mask, mask, advantages, old_logprobs=old, ref_logprobs=old - 0.1)
    moved = []
    for padding_free in (False, True):
        cfg = Config(optim=OptimConfig(lr=1.0, max_grad_norm=0.0), algo=preset_algo(num_minibatches=1),
                     train=TrainConfig(prompts_per_step=3, micro_batch_size=4, padding_free=padding_free))  # fmt: skip
        m = copy.deepcopy(model)
        sgd = torch.optim.SGD(m.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.LambdaLR(sgd, lambda s: 1.0)
        spec = update_spec(cfg, logprob_context(cfg, pad_id=0, autocast_dtype=None, device_type="cpu"))
        metrics = update_policy(m, sgd, sched, batch, spec, generator=torch.Generator().manual_seed(0))
        moved.append((metrics, [p.detach() - q for p, q in zip(m.parameters(), model.parameters(), strict=True)]))
    (want_m, want), (got_m, got) = moved
    assert abs(got_m["loss"] - want_m["loss"]) < 1e-6 and abs(got_m["grad_norm"] - want_m["grad_norm"]) < 1e-4
    assert max(float(d.abs().max()) for d in want) > 1e-3
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
