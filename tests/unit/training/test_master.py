"""fp32 master weights: a bf16-stored model moves like the fp32 one; fp16 loss scaling backs off."""

from __future__ import annotations

import copy

import torch

from grpolab.config import OptimConfig
from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model
from grpolab.training.master import MasterWeightOptimizer, grads_to_clip, scale_backed_off
from grpolab.training.optim import build_optimizer

OPTIM = OptimConfig(lr=1e-6, max_grad_norm=0.0)


def _ten_steps(model, grads, master_weights=None):
    optimizer, scheduler = build_optimizer(model, OPTIM, total_steps=10, master_weights=master_weights)
    for step_grads in grads:
        optimizer.zero_grad(set_to_none=True)
        for p, g in zip(model.parameters(), step_grads, strict=True):
            p.grad = g.to(p.dtype)
        grads_to_clip(model, optimizer)
        optimizer.step()
        scheduler.step()
    return optimizer


def test_ten_adamw_steps_at_lr_1e6_move_a_bf16_model_like_the_fp32_one():
    bf16 = build_tiny_model(build_char_tokenizer(), hidden_size=64, num_layers=1, num_heads=4).to(torch.bfloat16)
    fp32 = copy.deepcopy(bf16).float()  # the same starting weights
    naive = copy.deepcopy(bf16)
    start = [p.detach().clone() for p in bf16.parameters()]
    gen = torch.Generator().manual_seed(0)
    grads = [[torch.randn(p.shape, generator=gen) * 1e-3 for p in fp32.parameters()] for _ in range(10)]

    optimizer = _ten_steps(bf16, grads)
    assert isinstance(optimizer, MasterWeightOptimizer)
    assert all(s["exp_avg"].dtype == torch.float32 for s in optimizer.optimizer.state.values())
    _ten_steps(fp32, grads)
    _ten_steps(naive, grads, master_weights=False)  # AdamW on the bf16 weights themselves

    want = torch.cat([p.detach().to(torch.bfloat16).flatten() for p in fp32.parameters()])
    got = torch.cat([p.detach().flatten() for p in bf16.parameters()])
    plain = torch.cat([p.detach().flatten() for p in naive.parameters()])
    before = torch.cat([p.flatten() for p in start])
    moved = (want != before).float().mean()
    assert moved > 0.01  # fp32 training moves a few % of the bf16-rounded weights in 10 steps at 1e-6
    fp32_w = torch.cat([p.detach().flatten() for p in fp32.parameters()])
    ulp = torch.exp2(torch.floor(torch.log2(fp32_w.abs().clamp(min=1e-30))) - 7)  # bf16 spacing at the weight
    # master weights: the fp32 result rounded to bf16. The bf16-rounded gradients (relative error 2^-9)
    # shift the 1e-5 total update by ~2e-8: that flips a few ties, and matters for weights near zero.
    assert ((got.float() - fp32_w).abs() <= ulp + 1e-7).all()
    assert (got == want).float().mean() > 0.99
    move_fp32 = (fp32_w - before.float()).abs().mean()
    move_naive = (plain.float() - before.float()).abs().mean()
    assert move_naive < move_fp32 / 10  # without master weights most updates round away (measured ~45x)
    assert (plain == want).float().mean() < 0.98
    masters = torch.cat([m.detach().flatten() for m in optimizer.masters])
    torch.testing.assert_close(masters, fp32_w, atol=1e-7, rtol=2e-7)  # the fp32 trajectory itself


def test_fp16_loss_scaling_backs_off_on_overflow_and_then_steps():
    model = torch.nn.Linear(4, 3).to(torch.float16)
    optimizer, _ = build_optimizer(model, OptimConfig(lr=1e-2), total_steps=10)
    assert optimizer.scaler is not None
    scale = optimizer.scaler.get_scale()
    x = torch.ones(2, 4, dtype=torch.float16)
    optimizer.backward(model(x).float().sum() * 1e3)  # scaled by 65536: overflows fp16
    norm = torch.nn.utils.clip_grad_norm_(grads_to_clip(model, optimizer), float("inf"))
    assert not torch.isfinite(norm)
    assert scale_backed_off(optimizer, loss_finite=True)
    assert optimizer.scaler.get_scale() < scale
    before = model.weight.detach().clone()
    for _ in range(20):  # the scale comes down until the gradient fits, then the step is taken
        optimizer.zero_grad()
        optimizer.backward(model(x).float().sum() * 1e3)
        if torch.isfinite(torch.nn.utils.clip_grad_norm_(grads_to_clip(model, optimizer), float("inf"))):
            optimizer.step()
            break
        scale_backed_off(optimizer, loss_finite=True)
    assert not torch.equal(model.weight, before)
    assert optimizer.masters[0].dtype == torch.float32
    # the unscaled master gradient is the true one: d/dW sum(1e3 * W x) = 1e3 * 2 per entry
    torch.testing.assert_close(optimizer.masters[0].grad, torch.full((3, 4), 2e3))
