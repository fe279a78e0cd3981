"""The distributed world: rank, world size, device and the collectives the algorithm needs, in one room.

``torchrun`` (or Slurm's ``srun`` starting torchrun per node) sets RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT; ``session()`` reads them and joins the process group (gloo on a CPU;
on CUDA ``cpu:gloo,cuda:nccl``, as verl does, so a host tensor's collective never reaches NCCL, which
has none; one device per LOCAL_RANK). Without them the world is one process and there is no
process group, but the same helpers run: each then returns its input, so a single process takes the
very same code path (docs/design.md, "Distribution in one room"). The algorithm calls the named helpers below and never asks
which rank it is; logging, checkpoints and progress decide that themselves with ``is_main()``.

Under sequence parallelism (train.sequence_parallel = N, grpolab.distributed.sequence) the N ranks of a
sequence-parallel group hold the same rows: the data helpers below (shares, sums, means, gathers) then run
over the data-parallel ranks (``data_world``, set by ``set_data_parallel``), so each row is counted once;
with N = 1 those are all the ranks.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
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
_DATA: tuple[World, Any] | None = None
"""(this rank's data-parallel coordinates, their process group) under sequence parallelism; None: the world."""


def world() -> World:
    return _WORLD


def data_world() -> World:
    """This rank's place among the data-parallel ranks, which hold different rows: the world itself unless
    sequence parallelism makes groups of ranks share rows."""
    return _WORLD if _DATA is None else _DATA[0]


def set_data_parallel(coordinates: World | None, group=None) -> None:
    """The data-parallel rank, size and group the data helpers use (None: the whole world again)."""
    global _DATA
    _DATA = None if coordinates is None else (coordinates, group)


def is_main() -> bool:
    """True on the one process that writes the run directory (rank 0)."""
    return _WORLD.rank == 0


def launched() -> bool:
    """True under torchrun (its environment is set), even with one process: ``session`` then joins a group."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 or "TORCHELASTIC_RUN_ID" in os.environ


def _active() -> bool:
    return _WORLD.size > 1 and tdist.is_initialized()


def backend_for(device_type: str) -> str:
    """The process group's backend: gloo on a CPU; on CUDA NCCL for device tensors and gloo for host
    ones (object collectives, a CPU tensor someone passes)."""
    return "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"


def init_kwargs(device_type: str, *, timeout_s: float, bind_device: bool) -> dict[str, Any]:
    """``init_process_group``'s arguments. ``bind_device`` passes ``device_id`` (cuda:LOCAL_RANK): NCCL
    makes its communicator at once and knows each rank's device (train.dist_bind_device)."""
    kwargs: dict[str, Any] = {"backend": backend_for(device_type), "timeout": datetime.timedelta(seconds=timeout_s)}
    if device_type == "cuda" and bind_device:
        kwargs["device_id"] = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return kwargs


def session_options(train) -> dict[str, Any]:
    """``session``'s keyword arguments from the config's ``train`` section."""
    return {"timeout_s": float(train.dist_timeout_s), "bind_device": bool(train.dist_bind_device)}


@contextlib.contextmanager
def session(device_type: str, *, timeout_s: float = 600.0, bind_device: bool = True) -> Iterator[World]:
    """Join the process group torchrun's environment describes (if any), and leave it on exit.

    A process group someone else started (a test, a caller) is used as it is and left open.
    ``timeout_s`` bounds every collective, so a rank that never arrives cannot hang the others forever
    (train.dist_timeout_s).
    """
    global _WORLD, _TIMEOUT_S
    _TIMEOUT_S = timeout_s  # a side group (side_group) is bounded alike
    started = False
    if launched() and not tdist.is_initialized():
        if device_type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        tdist.init_process_group(**init_kwargs(device_type, timeout_s=timeout_s, bind_device=bind_device))
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


_TIMEOUT_S = 600.0
"""The session's collective timeout (train.dist_timeout_s), for the groups made later."""

_THREAD = threading.local()
"""``group``: the process group this thread's collectives use (None: the default one)."""


def _group():
    return getattr(_THREAD, "group", None)


def _data_group():
    """The group a data helper reduces over: the thread's side group, else the data-parallel ranks'."""
    side = _group()
    return side if side is not None or _DATA is None else _DATA[1]


def _data_active() -> bool:
    return data_world().size > 1 and tdist.is_initialized()


def side_group():
    """A process group of its own (gloo, every rank) for a thread that runs collectives beside the main
    thread's: the background sampler of rollout.max_staleness > 0, whose dynamic-sampling rounds all-reduce
    while the main thread's backward all-reduces gradients. Sharing one group, the two threads' calls would
    pair up across ranks in whatever order they came. Made by every rank's main thread, in the same order
    (``new_group`` is collective); None in a single process. The thread enters ``on_group`` with it;
    ``destroy_group`` ends it once the thread is done."""
    if not _active():
        return None
    return tdist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=_TIMEOUT_S))


@contextlib.contextmanager
def on_group(group) -> Iterator[None]:
    """The calling thread's collectives on ``group`` (from ``side_group``) for the whole body."""
    _THREAD.group = group
    try:
        yield
    finally:
        _THREAD.group = None


def destroy_group(group) -> None:
    if group is not None and tdist.is_initialized():
        tdist.destroy_process_group(group)


def _device() -> torch.device:
    """Where the collectives' tensors go: the CUDA device when NCCL is in the group, else the host."""
    if _active() and "nccl" in str(tdist.get_backend(_group())):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _reduce(values: Sequence[float], op, *, data: bool = False) -> list[float]:
    """``values`` reduced over every rank, or with ``data`` over the data-parallel ranks (a sum or a mean
    must count the rows that sequence-parallel ranks share once; a maximum may take them all)."""
    if not (_data_active() if data else _active()):
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_device())
    tdist.all_reduce(t, op=op, group=_data_group() if data else _group())
    return t.cpu().tolist()


def all_reduce_sum(value: float) -> float:
    """The sum of ``value`` over the data-parallel ranks (all ranks without sequence parallelism)."""
    return _reduce([value], tdist.ReduceOp.SUM, data=True)[0]


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
    return dict(zip(keys, _reduce([values[k] for k in keys], tdist.ReduceOp.SUM, data=True), strict=True))


def reduce_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """Metrics of every rank's share of the step, combined: ``*_max`` and ``sys/time*`` take the
    maximum, ``*_min`` the minimum, the rest the mean over ranks (every rank holds the same number of
    prompts and completions, so a mean of per-rank means is the global mean; a ``*_std`` is then the
    mean of per-rank standard deviations). Keys only some ranks hold are left out."""
    if not _data_active():
        return dict(metrics)
    keys = sorted(metrics)
    everyone = _common_keys(keys)
    out: dict[str, float] = {}
    for group, op in (("max", tdist.ReduceOp.MAX), ("min", tdist.ReduceOp.MIN), ("mean", tdist.ReduceOp.SUM)):
        names = [k for k in everyone if _kind(k) == group]
        if names:
            reduced = _reduce([_nan_safe(metrics[k]) for k in names], op, data=True)
            size = data_world().size
            out.update({k: v / size if group == "mean" else v for k, v in zip(names, reduced, strict=True)})
    return out


def _kind(key: str) -> str:
    """How a metric combines over ranks, from its name: ``adv_abs_max``, ``completions/max_length``,
    ``.../max`` are maxima (TRL's names put max / min first), ``sys/time*`` too."""
    last = key.rsplit("/", 1)[-1]
    if _extreme(last, "max") or key.startswith(("sys/time", "sys/peak_")) or key == "sys/step_time_s":
        return "max"
    return "min" if _extreme(last, "min") else "mean"


def _extreme(name: str, which: str) -> bool:
    return name == which or name.startswith(f"{which}_") or name.endswith(f"_{which}")


def _nan_safe(v: float) -> float:
    return float(v) if v is not None else float("nan")


def _common_keys(keys: list[str]) -> list[str]:
    gathered: list[list[str] | None] = [None] * data_world().size
    tdist.all_gather_object(gathered, keys, group=_data_group())
    common = set(keys)
    for other in gathered:
        common &= set(other or [])
    return sorted(common)


def broadcast_object(obj: T) -> T:
    """Rank 0's ``obj`` on every rank (a path, a decision)."""
    if not _active():
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=0, group=_group())
    return box[0]


def barrier() -> None:
    if _active():
        tdist.barrier(group=_group())


def gather_rows(t: torch.Tensor) -> torch.Tensor:
    """Every data-parallel rank's ``t`` (same shape everywhere) concatenated along dim 0, in rank order."""
    if not _data_active():
        return t
    # on the backend's device (rewards and valid flags are host tensors; NCCL takes only CUDA ones), and
    # as uint8: gloo has no bool collectives
    sent = t.to(device=_device(), dtype=torch.uint8 if t.dtype == torch.bool else t.dtype)
    parts = [torch.empty_like(sent) for _ in range(data_world().size)]
    tdist.all_gather(parts, sent.contiguous(), group=_data_group())
    return torch.cat(parts).to(device=t.device, dtype=t.dtype)


def gather_ragged(t: torch.Tensor) -> torch.Tensor:
    """Every rank's 1-D float ``t`` (lengths may differ) concatenated in rank order. Padded to the longest
    with -inf for the collective, so ``t`` must hold finite values only (entropies, log-probs)."""
    if not _data_active():
        return t
    longest = int(all_reduce_max(float(t.numel())))
    padded = torch.cat([t, t.new_full((longest - t.numel(),), float("-inf"))])
    gathered = gather_rows(padded)
    return gathered[gathered > float("-inf")]


def local_rows(t: torch.Tensor) -> torch.Tensor:
    """This rank's slice of a tensor made by ``gather_rows``."""
    me = data_world()
    n = t.shape[0] // me.size
    return t[me.rank * n : (me.rank + 1) * n]


def shard(rows: Sequence[T]) -> list[T]:
    """This rank's contiguous share of the step's rows (prompt indices): data-parallel rank r takes the r-th
    slice (the ranks of a sequence-parallel group take the same one)."""
    me = data_world()
    n, size = len(rows), me.size
    if n % size:
        where = "ranks (WORLD_SIZE)" if _DATA is None else "data-parallel ranks (WORLD_SIZE / train.sequence_parallel)"
        raise ConfigError(
            f"train.prompts_per_step={n} does not split evenly over {size} {where}: "
            f"use a multiple of {size}, or launch a number of processes that divides {n}"
        )
    k = n // size
    return list(rows[me.rank * k : (me.rank + 1) * k])


def my_range(n: int) -> range:
    """This rank's contiguous share of ``n`` items, as even as it goes (the first ranks take one more)."""
    me = data_world()
    k, extra = divmod(n, me.size)
    start = me.rank * k + min(me.rank, extra)
    return range(start, start + k + (1 if me.rank < extra else 0))


def gather_lists(*lists: list) -> tuple[list, ...]:
    """Each list concatenated over ranks, in rank order (the inverse of ``my_range``)."""
    if not _data_active():
        return lists
    gathered: list[tuple | None] = [None] * data_world().size
    tdist.all_gather_object(gathered, lists, group=_data_group())
    return tuple([x for part in gathered for x in part[i]] for i in range(len(lists)))


def check_divisible(prompts_per_step: int) -> None:
    """The launch check of ``shard``, run before any model loads."""
    shard(range(prompts_per_step))


def grad_scale() -> float:
    """DDP and FSDP average gradients over ranks; the loss of each rank is a share of the global
    loss (its normalisers are global), so it is multiplied by the world size to get the sum. Under
    sequence parallelism the N ranks of a group each back-propagate only through their own positions
    (their gradients add up to the group's), so the factor is still the whole world's size."""
    return float(_WORLD.size)


def global_masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """The mean of ``x``'s counted entries over all ranks, as a float (a token-weighted metric; the per-row
    tensor version, on one process, is ``grpolab.algo.masked.masked_mean``)."""
    m = mask.to(x.dtype)
    count, total = _reduce([float(m.sum()), float((x * m).sum())], tdist.ReduceOp.SUM, data=True)
    return total / max(count, 1.0)


def global_masked_mean_var(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased variance of ``x``'s counted entries over all ranks (two passes, as masked_var)."""
    m = mask.to(x.dtype)
    count, total = _reduce([float(m.sum()), float((x * m).sum())], tdist.ReduceOp.SUM, data=True)
    mean = total / max(count, 1.0)
    (sq,) = _reduce([float((((x - mean) * m) ** 2).sum())], tdist.ReduceOp.SUM, data=True)
    var = sq / max(count - 1.0, 1.0)
    return torch.tensor(mean, dtype=x.dtype, device=x.device), torch.tensor(var, dtype=x.dtype, device=x.device)


def describe() -> dict[str, Any]:
    return {"rank": _WORLD.rank, "world_size": _WORLD.size, "backend": tdist.get_backend() if _active() else None}
