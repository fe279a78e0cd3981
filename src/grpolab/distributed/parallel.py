"""Wrapping models for data-parallel (DDP) or sharded (FSDP2) training, chosen by ``train.parallel``.

* ``ddp``: ``DistributedDataParallel``; every rank holds the whole model and optimizer; gradients are
  averaged by an all-reduce during backward.
* ``fsdp``: ``torch.distributed.fsdp.fully_shard`` on each decoder layer (the model's
  ``_no_split_modules``) and on the root; parameters, gradients and optimizer state are sharded over
  the ranks. fp32 master parameters; compute and all-gathers in bf16 when the model is configured for
  bf16 weights or bf16 autocast (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``),
  gradients reduced in fp32. Rank 0 alone reads the weights (into host memory), the other ranks build
  the model on the meta device, and the shards are broadcast (``materialize_from_rank0``).

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
        # the gradients are views into DDP's all-reduce buckets, not a second copy beside them (one model's
        # gradients less per rank: ~0.5 GB on a 0.5B model, measured with benchmarks/long_context.py)
        return DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)
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


def loads_on_rank0(mode: str) -> bool:
    """FSDP2: rank 0 reads the weights into host memory, the others build the model on the meta device
    (with LoRA, PEFT wraps the meta model: its adapter too has shapes only); ``materialize_from_rank0``
    fills the shards after ``fully_shard``, which moves each layer's shard to the GPU (and casts it to fp32
    on the host first, in shard_fsdp): no GPU holds the unsharded model, in bf16 or fp32. Rank 0's LoRA
    initialisation is the one every rank gets."""
    return mode == "fsdp"


def materialize_from_rank0(model: nn.Module, full_state: dict, device: torch.device) -> None:
    """Give a sharded model rank 0's weights: the meta ranks' storage is allocated on ``device`` (only
    their shards), rank 0's full state dict is broadcast shard by shard (DCP's set_model_state_dict with
    broadcast_from_rank0, as verl loads), and the buffers the state dict leaves out (rotary frequencies)
    are broadcast as they are."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
        model.to_empty(device=device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full_state if dist.is_main() else {}, options=options)
    for buffer in model.buffers():
        torch.distributed.broadcast(buffer, src=0)


def fsdp_param_dtype(model_dtype: str, autocast_dtype: torch.dtype | None) -> torch.dtype | None:
    """FSDP2's ``param_dtype``: bf16 for bf16 weights and also under bf16 autocast, where every matmul
    rounds its weights to bf16 anyway. Then the all-gathers (each forward and backward, and the whole
    model gathered for sampling) move bf16, half the bytes of fp32; the sharded masters stay fp32."""
    if model_dtype == "bfloat16" or autocast_dtype == torch.bfloat16:
        return torch.bfloat16
    return None


@contextlib.contextmanager
def gradient_sync(model: nn.Module, sync: bool) -> Iterator[None]:
    """Backward passes inside add up their gradients locally under DDP (``no_sync``) unless ``sync``:
    the all-reduce runs once per optimizer step, on the last micro-batch, not on every one. Every rank
    has the same number of micro-batches (training/microbatch.py), so the last one is the same
    everywhere. FSDP2 keeps reducing each micro-batch: its gradients stay sharded (unsharded ones
    would cost the memory FSDP saves)."""
    from torch.nn.parallel import DistributedDataParallel

    if sync or not isinstance(model, DistributedDataParallel):
        yield
        return
    with model.no_sync():
        yield


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
    """The plain module to sample from: DDP's inner module; an FSDP model with every layer gathered.
    Afterwards each unit reshards after its forward again, except the root (embeddings, norm, head),
    which FSDP2 keeps gathered from its forward to its backward (it would be gathered again at once)."""
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
            m.set_reshard_after_forward(m is not model, recurse=False)


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
