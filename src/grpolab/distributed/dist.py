"""The distributed world: rank, world size, device and the collectives the algorithm needs, in one room.

``torchrun`` (or Slurm's ``srun`` starting torchrun per node) sets RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT; ``session()`` reads them and joins the process group (gloo on a CPU,
NCCL on CUDA, one device per LOCAL_RANK). Without them the world is one process and there is no
process group, but the same helpers run: each then returns its input, so a single process takes the
very same code path (STYLE.md habit 11). The algorithm calls the named helpers below and never asks
which rank it is; logging, checkpoints and progress decide that themselves with ``is_main()``.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as tdist

from grpolab.config import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    rank: int = 0
    """This process's global rank, 0 .. size - 1."""
    size: int = 1
    """Number of processes (WORLD_SIZE)."""
    local_rank: int = 0
    """Rank within this node; the CUDA device index."""


_WORLD = World()


def world() -> World:
    return _WORLD


def is_main() -> bool:
    """True on the one process that writes the run directory (rank 0)."""
    return _WORLD.rank == 0


def _active() -> bool:
    return _WORLD.size > 1 and tdist.is_initialized()


@contextlib.contextmanager
def session(device_type: str, *, timeout_s: float = 600.0) -> Iterator[World]:
    """Join the process group torchrun's environment describes (if any), and leave it on exit.

    A process group someone else started (a test, a caller) is used as it is and left open.
    ``timeout_s`` bounds every collective, so a rank that never arrives cannot hang the others forever.
    """
    global _WORLD
    size = int(os.environ.get("WORLD_SIZE", "1"))
    launched = size > 1 or "TORCHELASTIC_RUN_ID" in os.environ  # torchrun, even with one process (FSDP)
    started = False
    if launched and not tdist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        tdist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        started = True
    previous = _WORLD
    if tdist.is_initialized():
        _WORLD = World(tdist.get_rank(), tdist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    try:
        yield _WORLD
    finally:
        _WORLD = previous
        if started:
            tdist.destroy_process_group()


def _device() -> torch.device:
    if _active() and tdist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _reduce(values: Sequence[float], op) -> list[float]:
    if not _active():
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_device())
    tdist.all_reduce(t, op=op)
    return t.cpu().tolist()


def all_reduce_sum(value: float) -> float:
    """The sum of ``value`` over all ranks."""
    return _reduce([value], tdist.ReduceOp.SUM)[0]


def all_reduce_mean(value: float) -> float:
    return all_reduce_sum(value) / _WORLD.size


def all_reduce_max(value: float) -> float:
    return _reduce([value], tdist.ReduceOp.MAX)[0]


def global_token_count(mask: torch.Tensor) -> float:
    """Counted tokens (True entries of ``mask``) over all ranks: the token-mean normaliser."""
    return all_reduce_sum(float(mask.sum().item()))


def any_rank(flag: bool) -> bool:
    """True when ``flag`` is True on some rank (a stop request, a non-finite loss)."""
    return all_reduce_max(1.0 if flag else 0.0) > 0


def sum_dict(values: Mapping[str, float]) -> dict[str, float]:
    """Each value summed over ranks, in one collective. Every rank must pass the same keys."""
    keys = sorted(values)
    return dict(zip(keys, _reduce([values[k] for k in keys], tdist.ReduceOp.SUM), strict=True))


def reduce_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """Metrics of every rank's share of the step, combined: ``*_max`` and ``sys/time*`` take the
    maximum, ``*_min`` the minimum, the rest the mean over ranks (every rank holds the same number of
    prompts and completions, so a mean of per-rank means is the global mean; a ``*_std`` is then the
    mean of per-rank standard deviations). Keys only some ranks hold are left out."""
    if not _active():
        return dict(metrics)
    keys = sorted(metrics)
    everyone = _common_keys(keys)
    out: dict[str, float] = {}
    for group, op in (("max", tdist.ReduceOp.MAX), ("min", tdist.ReduceOp.MIN), ("mean", tdist.ReduceOp.SUM)):
        names = [k for k in everyone if _kind(k) == group]
        if names:
            reduced = _reduce([_nan_safe(metrics[k]) for k in names], op)
            out.update({k: v / _WORLD.size if group == "mean" else v for k, v in zip(names, reduced, strict=True)})
    return out


def _kind(key: str) -> str:
    """How a metric combines over ranks, from its name: ``adv_abs_max``, ``completions/max_length``,
    ``.../max`` are maxima (TRL's names put max / min first), ``sys/time*`` too."""
    last = key.rsplit("/", 1)[-1]
    if _extreme(last, "max") or key.startswith("sys/time") or key in ("sys/step_time_s", "sys/peak_mem_mb"):
        return "max"
    return "min" if _extreme(last, "min") else "mean"


def _extreme(name: str, which: str) -> bool:
    return name == which or name.startswith(f"{which}_") or name.endswith(f"_{which}")


def _nan_safe(v: float) -> float:
    return float(v) if v is not None else float("nan")


def _common_keys(keys: list[str]) -> list[str]:
    gathered: list[list[str] | None] = [None] * _WORLD.size
    tdist.all_gather_object(gathered, keys)
    common = set(keys)
    for other in gathered:
        common &= set(other or [])
    return sorted(common)


def broadcast_object(obj: T) -> T:
    """Rank 0's ``obj`` on every rank (a path, a decision)."""
    if not _active():
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if _active():
        tdist.barrier()


def gather_rows(t: torch.Tensor) -> torch.Tensor:
    """Every rank's ``t`` (same shape everywhere) concatenated along dim 0, in rank order."""
    if not _active():
        return t
    sent = t.to(torch.uint8) if t.dtype == torch.bool else t  # gloo has no bool collectives
    parts = [torch.empty_like(sent) for _ in range(_WORLD.size)]
    tdist.all_gather(parts, sent.contiguous())
    return torch.cat(parts).to(t.dtype)


def local_rows(t: torch.Tensor) -> torch.Tensor:
    """This rank's slice of a tensor made by ``gather_rows``."""
    n = t.shape[0] // _WORLD.size
    return t[_WORLD.rank * n : (_WORLD.rank + 1) * n]


def shard(rows: Sequence[T]) -> list[T]:
    """This rank's contiguous share of the step's rows (prompt indices): rank r takes the r-th slice."""
    n, size = len(rows), _WORLD.size
    if n % size:
        raise ConfigError(
            f"train.prompts_per_step={n} does not split evenly over {size} ranks (WORLD_SIZE): "
            f"use a multiple of {size}, or launch a number of processes that divides {n}"
        )
    k = n // size
    return list(rows[_WORLD.rank * k : (_WORLD.rank + 1) * k])


def my_range(n: int) -> range:
    """This rank's contiguous share of ``n`` items, as even as it goes (the first ranks take one more)."""
    k, extra = divmod(n, _WORLD.size)
    start = _WORLD.rank * k + min(_WORLD.rank, extra)
    return range(start, start + k + (1 if _WORLD.rank < extra else 0))


def gather_lists(*lists: list) -> tuple[list, ...]:
    """Each list concatenated over ranks, in rank order (the inverse of ``my_range``)."""
    if not _active():
        return lists
    gathered: list[tuple | None] = [None] * _WORLD.size
    tdist.all_gather_object(gathered, lists)
    return tuple([x for part in gathered for x in part[i]] for i in range(len(lists)))


def check_divisible(prompts_per_step: int) -> None:
    """The launch check of ``shard``, run before any model loads."""
    shard(range(prompts_per_step))


def grad_scale() -> float:
    """DDP and FSDP average gradients over ranks; the loss of each rank is a share of the global
    loss (its normalisers are global), so it is multiplied by the world size to get the sum."""
    return float(_WORLD.size)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """The mean of ``x``'s counted entries over all ranks (a token-weighted metric)."""
    m = mask.to(x.dtype)
    count, total = _reduce([float(m.sum()), float((x * m).sum())], tdist.ReduceOp.SUM)
    return total / max(count, 1.0)


def masked_mean_var(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased variance of ``x``'s counted entries over all ranks (two passes, as masked_var)."""
    m = mask.to(x.dtype)
    count, total = _reduce([float(m.sum()), float((x * m).sum())], tdist.ReduceOp.SUM)
    mean = total / max(count, 1.0)
    (sq,) = _reduce([float((((x - mean) * m) ** 2).sum())], tdist.ReduceOp.SUM)
    var = sq / max(count - 1.0, 1.0)
    return torch.tensor(mean, dtype=x.dtype, device=x.device), torch.tensor(var, dtype=x.dtype, device=x.device)


def describe() -> dict[str, Any]:
    return {"rank": _WORLD.rank, "world_size": _WORLD.size, "backend": tdist.get_backend() if _active() else None}
