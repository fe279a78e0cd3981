"""Shared-prompt forward, bf16 against fp32 at the loss level, and the bf16 reference copy."""

from __future__ import annotations

import functools

import torch

from grpolab.algo.kl import kl_k3
from grpolab.algo.losses import Aggregation, clipped_surrogate_loss
from grpolab.models.loading import Reference
from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model
from grpolab.training.logprobs import completion_logprobs
from grpolab.training.spec import PolicyLossSpec
from grpolab.training.step import policy_loss
from grpolab.types import RolloutBatch

BF16 = torch.bfloat16


def _setup(seed=1, hidden=64):
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=hidden, num_layers=2, num_heads=4, seed=seed)
    prompts = [tok("12+3=")["input_ids"], tok("7=")["input_ids"]]
    rows = [prompts[i] for i in (0, 0, 1, 1, 0, 1)]  # G-style repeats, interleaved, two prompt lengths
    completion = torch.randint(4, 60, (6, 7), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(6, 7, dtype=torch.bool)
    mask[1, 5:] = mask[3, 2:] = False
    return model, rows, completion, mask


def _grads(model, rows, completion, mask, amp, one_by_one: bool):
    model.zero_grad()
    if one_by_one:  # each row alone: no prompt is shared
        lp = torch.cat(
            [
                completion_logprobs(
                    model, [rows[i]], completion[i : i + 1], mask[i : i + 1], pad_id=0, autocast_dtype=amp
                )[0]
                for i in range(len(rows))
            ]
        )
    else:
        lp, _ = completion_logprobs(model, rows, completion, mask, pad_id=0, autocast_dtype=amp)
    (lp * torch.linspace(-1, 1, lp.numel()).view_as(lp)).sum().backward()
    return lp.detach(), [p.grad.clone() for p in model.parameters()]


def test_shared_prompt_forward_equals_separate_rows_with_gradients():
    model, rows, completion, mask = _setup()
    shared, g_shared = _grads(model, rows, completion, mask, None, one_by_one=False)
    alone, g_alone = _grads(model, rows, completion, mask, None, one_by_one=True)
    torch.testing.assert_close(shared, alone, atol=1e-5, rtol=0)
    for a, b in zip(g_shared, g_alone, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def _loss(model, rows, completion, mask, amp, ref_logprobs):
    logprobs, _ = completion_logprobs(model, rows, completion, mask, pad_id=0, autocast_dtype=amp)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.2, -0.2])[:, None].expand_as(mask) * mask
    batch = RolloutBatch(
        prompt_ids=rows,
        completion_ids=completion,
        completion_mask=mask,
        loss_mask=mask,
        advantages=advantages,
        ref_logprobs=ref_logprobs,
    )
    spec = PolicyLossSpec(
        surrogate=functools.partial(clipped_surrogate_loss, clip_low=0.2, clip_high=0.2, dual_clip=None, level="token"),
        aggregate=Aggregation.named("seq-mean-token-mean"),  # GRPO (TRL loss_type="grpo")
        kl=kl_k3,
        beta=0.04,
    )
    loss, _ = policy_loss(
        logprobs, logprobs.detach(), batch, spec, total_seqs=6.0, total_tokens=float(mask.sum())
    )
    model.zero_grad()
    loss.backward()
    return loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])


def test_bf16_loss_and_gradient_stay_close_to_fp32():
    model, rows, completion, mask = _setup(seed=2, hidden=128)
    with torch.no_grad():  # a reference that differs from the policy, so the KL term is not zero
        ref_model = build_tiny_model(
            build_char_tokenizer(), hidden_size=128, num_layers=2, num_heads=4, seed=9
        )
        ref_logprobs, _ = completion_logprobs(ref_model, rows, completion, mask, pad_id=0)
    loss32, grad32 = _loss(model, rows, completion, mask, None, ref_logprobs)
    loss16, grad16 = _loss(model, rows, completion, mask, BF16, ref_logprobs)
    assert abs(float(loss16 - loss32)) < 2e-3 * max(1.0, abs(float(loss32)))
    cosine = torch.nn.functional.cosine_similarity(grad16, grad32, dim=0)
    assert cosine > 0.99, f"bf16 gradient direction drifted: cosine {cosine:.4f}"
    assert (grad16.norm() / grad32.norm() - 1).abs() < 0.05


def test_bf16_reference_copy_gives_zero_kl_to_an_identical_policy():
    """pi_ref stored with bf16 Linear weights computes what the fp32 policy computes under autocast."""
    model, rows, completion, mask = _setup(seed=3)
    reference = Reference(model, BF16)
    assert reference.frozen_model.model.layers[0].mlp.up_proj.weight.dtype == BF16
    with torch.no_grad(), reference.model() as ref:
        ref_lp, _ = completion_logprobs(ref, rows, completion, mask, pad_id=0, autocast_dtype=BF16)
        policy_lp, _ = completion_logprobs(model, rows, completion, mask, pad_id=0, autocast_dtype=BF16)
        fp32_lp, _ = completion_logprobs(model, rows, completion, mask, pad_id=0)
    assert float(kl_k3(policy_lp, ref_lp)[mask].abs().max()) < 1e-6
    assert float((ref_lp - fp32_lp).abs().max()) < 0.05
