"""Wrapping models for data-parallel (DDP) or sharded (FSDP2) training, chosen by ``train.parallel``.

* ``ddp``: ``DistributedDataParallel``; every rank holds the whole model and optimizer; gradients are
  averaged by an all-reduce during backward.
* ``fsdp``: ``torch.distributed.fsdp.fully_shard`` on each decoder layer (the model's
  ``_no_split_modules``) and on the root; parameters, gradients and optimizer state are sharded over
  the ranks. fp32 master parameters; compute in bf16 when the model is configured for bf16
  (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``), gradients reduced in fp32.

Departures: sampling under FSDP all-gathers every layer once, keeps them gathered for the whole
decode loop (ranks decode different numbers of tokens, so per-forward all-gathers would not match up),
and frees them after; that costs one full copy of the weights on each rank while sampling.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch
from torch import nn

from grpolab.config import ConfigError
from grpolab.distributed import dist

log = logging.getLogger(__name__)

PARALLEL_MODES = ("auto", "none", "ddp", "fsdp")


def resolve_parallel(mode: str, world_size: int) -> str:
    """``auto``: DDP when launched on several processes, none otherwise."""
    if mode == "auto":
        return "ddp" if world_size > 1 else "none"
    if mode == "fsdp" and not torch.distributed.is_initialized():
        raise ConfigError(
            "train.parallel=fsdp needs a process group: launch with torchrun (one process: "
            "torchrun --nproc_per_node 1 -m grpolab train ...), or set train.parallel=none"
        )
    if mode == "none" and world_size > 1:
        raise ConfigError(
            f"train.parallel=none under {world_size} processes would train {world_size} diverging copies: "
            "set train.parallel=ddp (or fsdp, or auto), or launch without torchrun"
        )
    return mode


def wrap(model: nn.Module, mode: str, device: torch.device, *, compute_dtype: torch.dtype | None = None) -> nn.Module:
    """``model`` made ready for ``mode`` ("none", "ddp", "fsdp"); call before building its optimizer."""
    if mode == "none":
        return model
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    return shard_fsdp(model, compute_dtype=compute_dtype)


def shard_fsdp(model: nn.Module, *, compute_dtype: torch.dtype | None = None) -> nn.Module:
    """fully_shard each decoder layer, then the root (embeddings, norm, head). In place; returns it."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model.float()  # fp32 master parameters; bf16 only in compute
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in _layers(model):
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def _layers(model: nn.Module) -> list[nn.Module]:
    names: set[str] = set()
    for m in model.modules():
        names |= set(getattr(m, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def is_wrapped(model: nn.Module) -> bool:
    """True for a DDP or FSDP2 model: it must be called as a whole, so that its hooks run."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(model, DistributedDataParallel | FSDPModule)


def unwrap(model: nn.Module) -> nn.Module:
    """The module DDP wraps (FSDP2 changes the module in place: itself)."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """torch's clip_grad_norm_, with the norm of FSDP's sharded gradients made whole (same on every rank)."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


@contextlib.contextmanager
def gathered(model: nn.Module) -> Iterator[nn.Module]:
    """The plain module to sample from: DDP's inner module; an FSDP model with every layer gathered."""
    if not is_sharded(model):
        yield unwrap(model)
        return
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in units:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield model
    finally:
        for m in units:
            m.reshard()
            m.set_reshard_after_forward(True, recurse=False)


class GatheredSampler:
    """A sampler over a wrapped model: each ``sample`` runs inside ``gathered(model)``."""

    def __init__(self, sampler, model: nn.Module):
        self.sampler, self.model = sampler, model

    def sample(self, *args, **kwargs):
        with gathered(self.model):
            return self.sampler.sample(*args, **kwargs)

    def update_weights(self, model: nn.Module) -> None:
        self.sampler.update_weights(model)

    def close(self) -> None:
        self.sampler.close()


def sampler_for(sampler, model: nn.Module):
    """The sampler itself for a plain or DDP model (built on the inner module), a GatheredSampler under FSDP."""
    return GatheredSampler(sampler, model) if is_sharded(model) else sampler


def wrap_reference(reference, mode: str, compute_dtype: torch.dtype | None):
    """Under FSDP the frozen reference copy is sharded like the policy (LoRA's adapter-off base is the
    policy itself). Under DDP it stays a plain local copy: it has no gradients to average."""
    if reference is not None and mode == "fsdp" and reference.frozen_model is not None:
        reference.frozen_model = shard_fsdp(reference.frozen_model, compute_dtype=compute_dtype)
        reference.frozen_model.requires_grad_(False)
    return reference


def log_layout(mode: str) -> None:
    w = dist.world()
    if w.size > 1 or mode != "none":
        log.info("parallel: %s over %d process(es) (rank %d)", mode, w.size, w.rank)
