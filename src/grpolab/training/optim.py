"""AdamW over the trainable parameters, with warm-up and a constant, linear or cosine schedule."""

from __future__ import annotations

import math

import torch

from grpolab.config import OptimConfig
from grpolab.training.master import MasterWeightOptimizer, wants_master_weights


def lr_lambda(step: int, *, warmup: int, total: int, schedule: str, min_ratio: float = 0.0) -> float:
    """Multiplier of the peak learning rate after ``step`` optimizer steps; ``min_ratio``: cosine's floor
    (transformers' cosine_with_min_lr: min + (1 - min) x the cosine)."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return 1.0
    progress = min((step - warmup) / max(total - warmup, 1), 1.0)
    if schedule == "linear":
        return 1.0 - progress
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def adamw(
    model: torch.nn.Module,
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    master_weights: bool | None = None,
):
    """AdamW over the trainable parameters of ``model``: the optimizer of every verb (train, sft, train-rm).
    ``master_weights``: step fp32 copies of bf16 / fp16 parameters (grpolab.training.master); None = whenever
    a trainable parameter is stored in bf16 / fp16. Pass False where another mechanism keeps fp32 parameters
    (FSDP2 with a MixedPrecisionPolicy)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")

    def build(tensors):
        # fused: one kernel per step, no full-size temporaries (the foreach default holds ~2 extra copies
        # of the states at the step's peak); CPU and CUDA floating tensors only
        fused = all(t.device.type in ("cpu", "cuda") and t.is_floating_point() for t in tensors)
        return torch.optim.AdamW(tensors, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused)

    if master_weights is None:
        master_weights = wants_master_weights(params)
    if master_weights:
        return MasterWeightOptimizer(params, build, loss_scaling=any(p.dtype == torch.float16 for p in params))
    return build(params)


def build_optimizer(model: torch.nn.Module, o: OptimConfig, *, total_steps: int, master_weights: bool | None = None):
    """(optimizer, scheduler) of a training run: ``adamw`` with the optim section ``o``, and its lr schedule over
    ``total_steps`` optimizer steps (train.num_steps x the optimizer steps of one generation batch)."""
    optimizer = adamw(model, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, master_weights=master_weights)
    inner = optimizer.optimizer if isinstance(optimizer, MasterWeightOptimizer) else optimizer
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        inner, lambda s: lr_lambda(s, warmup=o.warmup_steps, total=total_steps, schedule=o.schedule, min_ratio=o.min_lr_ratio)
    )
    return optimizer, scheduler


def apply_optim_config(optimizer: torch.optim.Optimizer, scheduler, o: OptimConfig) -> None:
    """After loading a checkpoint's optimizer and scheduler state: the optim section's lr and weight decay again.

    ``load_state_dict`` brings back the saved param groups (lr, weight_decay) and the scheduler's
    ``base_lrs``, so without this ``--resume optim.lr=1e-5`` would keep training at the old rate.
    The schedule's position (``last_epoch``) is kept; its base becomes ``o.lr`` (the critic's: algo.value_lr).
    """
    scheduler.base_lrs = [o.lr for _ in optimizer.param_groups]
    factors = [fn(scheduler.last_epoch) for fn in scheduler.lr_lambdas]
    for group, factor in zip(optimizer.param_groups, factors, strict=True):
        group["initial_lr"] = o.lr
        group["lr"] = o.lr * factor
        group["weight_decay"] = o.weight_decay
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
