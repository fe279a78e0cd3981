"""Sequence parallelism (DeepSpeed-Ulysses, train.sequence_parallel = N): the process groups, each rank's
share of a sequence, and the two collectives the training forward needs.

Layout (torchtitan's ParallelDims, two dimensions): WORLD_SIZE = D x N, rank r = d * N + s. The N
consecutive ranks d*N .. d*N + N-1 form sequence-parallel group d: they hold the same rows (data-parallel
rank d's share of the step) and each keeps 1/N of every sequence's positions, s-th slice on rank s. The D
ranks with the same s form a data-parallel group: the data helpers of grpolab.distributed.dist (shares,
normalisers, metric sums) run over it, so the rows a sequence-parallel group shares count once.

Gradients: each rank computes the whole micro-batch's loss (the log-probs of all positions are summed over
the group, ``sum_over_group``) but back-propagates only through its own positions; the all-to-alls of
attention carry each rank's share of the other positions' gradients back. The N ranks' gradients therefore
add up to the gradient of the group's rows, and DDP / FSDP2, which average over the whole world, take the
usual ``dist.grad_scale()`` (the world size) to make that sum the update one process would make.
"""

from __future__ import annotations

import contextlib
import datetime
import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist

from grpolab.distributed import dist
from grpolab.errors import ConfigError


@dataclass(frozen=True)
class Layout:
    """This rank's place in the D x N grid."""

    size: int = 1
    """N, ranks per sequence-parallel group (1: off)."""
    rank: int = 0
    """s, this rank's index in its group: it holds the s-th of N slices of every sequence."""
    group: Any = None
    """The sequence-parallel group's process group (None when N = 1)."""


_LAYOUT = Layout()


def layout() -> Layout:
    return _LAYOUT


def active() -> bool:
    """True when sequences are split over several ranks."""
    return _LAYOUT.size > 1


def check(n: int, world_size: int, *, launched: bool) -> None:
    """One-line errors for a grid that cannot be made (run before any model loads)."""
    if n < 1:
        raise ConfigError(f"train.sequence_parallel={n} must be >= 1 (1 = off)")
    if n > 1 and not launched:
        raise ConfigError(
            f"train.sequence_parallel={n} splits each sequence over {n} processes: launch with "
            f"torchrun --nproc_per_node {n} (or a multiple of it), or set train.sequence_parallel=1"
        )
    if world_size % n:
        raise ConfigError(
            f"train.sequence_parallel={n} does not divide WORLD_SIZE={world_size}: the world is data-parallel "
            f"size x {n}; launch a multiple of {n} processes or pick a divisor of {world_size}"
        )


@contextlib.contextmanager
def sequence_parallel(n: int, *, timeout_s: float = 600.0) -> Iterator[Layout]:
    """Make the sequence- and data-parallel groups of a D x N grid for the body (inside ``dist.session``).

    Every rank creates every group, in the same order (``new_group`` is collective). With N = 1 nothing
    is made and the world stays as it is."""
    global _LAYOUT
    world = dist.world()
    check(n, world.size, launched=tdist.is_initialized())
    if n == 1:
        yield _LAYOUT
        return
    d_size, timeout = world.size // n, datetime.timedelta(seconds=timeout_s)
    mine_sp = mine_dp = None
    for d in range(d_size):
        g = tdist.new_group([d * n + s for s in range(n)], timeout=timeout)
        mine_sp = g if world.rank // n == d else mine_sp
    for s in range(n):
        g = tdist.new_group([d * n + s for d in range(d_size)], timeout=timeout)
        mine_dp = g if world.rank % n == s else mine_dp
    previous = _LAYOUT
    _LAYOUT = Layout(n, world.rank % n, mine_sp)
    dist.set_data_parallel(dist.World(world.rank // n, d_size, world.local_rank), mine_dp)
    try:
        yield _LAYOUT
    finally:
        _LAYOUT = previous
        dist.set_data_parallel(None)


def padded_length(length: int, n: int | None = None) -> int:
    """``length`` rounded up to a multiple of N (every rank holds the same number of positions)."""
    n = _LAYOUT.size if n is None else n
    return -(-length // n) * n


def bounds(length: int, lay: Layout | None = None) -> tuple[int, int]:
    """[start, stop) of this rank's positions in a sequence padded to ``length`` (a multiple of N)."""
    lay = _LAYOUT if lay is None else lay
    k = length // lay.size
    return lay.rank * k, (lay.rank + 1) * k


class _AllToAll(torch.autograd.Function):
    """Split ``x`` into N blocks along ``scatter``, send block j to rank j, and concatenate the blocks
    received along ``gather`` in rank order. Its gradient is the reverse exchange."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group, scatter: int, gather: int) -> torch.Tensor:
        ctx.group, ctx.scatter, ctx.gather = group, scatter, gather
        return _exchange(x, group, scatter, gather)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _exchange(grad, ctx.group, ctx.gather, ctx.scatter), None, None, None


def _exchange(x: torch.Tensor, group, scatter: int, gather: int) -> torch.Tensor:
    n = tdist.get_world_size(group)
    send = torch.stack(x.chunk(n, dim=scatter)).contiguous()  # [N, ...]: block j for rank j
    received = torch.empty_like(send)
    tdist.all_to_all_single(received, send, group=group)
    return torch.cat(received.unbind(0), dim=gather)


def heads_for_positions(x: torch.Tensor, lay: Layout | None = None) -> torch.Tensor:
    """[b, heads, S/N, d] of this rank's positions -> [b, heads/N, S, d]: its heads, every position."""
    lay = _LAYOUT if lay is None else lay
    return _AllToAll.apply(x, lay.group, 1, 2)


def positions_for_heads(x: torch.Tensor, lay: Layout | None = None) -> torch.Tensor:
    """[b, S, heads/N, d] (attention's output layout) -> [b, S/N, heads, d]: every head, its positions."""
    lay = _LAYOUT if lay is None else lay
    return _AllToAll.apply(x, lay.group, 1, 2)


class _SumOverGroup(torch.autograd.Function):
    """The sum over the group of each rank's tensor (zeros outside its own positions): every rank then
    holds the whole sequence's values and computes the same loss. The gradient stays local (identity):
    each rank back-propagates the common loss's gradient through its own positions only."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        out = x.contiguous().clone()
        tdist.all_reduce(out, op=tdist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def sum_over_group(x: torch.Tensor, lay: Layout | None = None) -> torch.Tensor:
    lay = _LAYOUT if lay is None else lay
    return x if lay.size == 1 else _SumOverGroup.apply(x, lay.group)


def samples() -> bool:
    """True on the rank that samples and scores its group's rows: the group's first (every rank when N = 1).
    The group's other ranks do not sample (their draw would be the same work again, and sampling is not
    bitwise reproducible across devices): ``shared`` hands them the first rank's."""
    return _LAYOUT.rank == 0


def shared(obj):
    """The group's first rank's ``obj`` on every rank of its sequence-parallel group (what the others pass
    is ignored): the rows a group trains on are the ones its first rank sampled and scored. ``obj`` itself
    when N = 1.

    Sent as torch.save bytes and loaded with each CUDA tensor on this rank's device (a pickled CUDA tensor
    would come back on the first rank's GPU); host tensors stay on the host."""
    if _LAYOUT.size == 1:
        return obj
    box = [None]
    if _LAYOUT.rank == 0:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        box = [buffer.getvalue()]
    tdist.broadcast_object_list(box, group=_LAYOUT.group, group_src=0)
    if _LAYOUT.rank == 0:
        return obj
    return torch.load(io.BytesIO(box[0]), map_location=_here, weights_only=False)


def _here(storage, location: str):
    """torch.load's map_location: a CUDA storage onto this rank's device, a host one left on the host."""
    return storage.cuda(torch.cuda.current_device()) if location.startswith("cuda") else storage
