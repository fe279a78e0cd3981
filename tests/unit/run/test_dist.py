"""The rank arithmetic of grpolab.distributed.dist and the launch checks of grpolab.distributed.parallel (no process group:
the helpers that only split work are checked by setting the world they see)."""

from __future__ import annotations

import pytest

from grpolab.config import ConfigError
from grpolab.distributed import dist
from grpolab.distributed.parallel import resolve_parallel


@pytest.fixture
def as_rank(monkeypatch):
    def set_world(rank: int, size: int) -> None:
        monkeypatch.setattr(dist, "_WORLD", dist.World(rank=rank, size=size, local_rank=rank))

    return set_world


def test_shard_gives_each_rank_its_contiguous_share(as_rank):
    rows = [10, 11, 12, 13, 14, 15]
    shares = []
    for rank in range(3):
        as_rank(rank, 3)
        shares.append(dist.shard(rows))
    assert shares == [[10, 11], [12, 13], [14, 15]]


def test_prompts_that_do_not_split_evenly_are_a_config_error(as_rank):
    as_rank(0, 2)
    with pytest.raises(ConfigError, match=r"train.prompts_per_step=3 .* 2 ranks .* multiple of 2"):
        dist.check_divisible(3)


def test_eval_ranges_cover_every_prompt_once_first_ranks_take_one_more(as_rank):
    ranges = []
    for rank in range(2):
        as_rank(rank, 2)
        ranges.append(dist.my_range(5))
    assert ranges == [range(0, 3), range(3, 5)]


def test_one_process_helpers_return_their_input():
    assert dist.world() == dist.World()
    assert dist.all_reduce_sum(2.5) == 2.5
    assert dist.grad_scale() == 1.0
    assert dist.reduce_metrics({"a": 1.0, "completions/max_length": 3.0}) == {"a": 1.0, "completions/max_length": 3.0}
    assert dist.gather_lists([1], ["x"]) == ([1], ["x"])
    assert not dist.any_rank(False) and dist.any_rank(True)


def test_metric_kinds():
    assert dist._kind("completions/max_length") == "max"
    assert dist._kind("completions/max_terminated_length") == "max"
    assert dist._kind("train/adv_abs_max") == "max"
    assert dist._kind("sys/time_generation_s") == "max"
    assert dist._kind("completions/min_length") == "min"
    assert dist._kind("reward") == "mean"
    assert dist._kind("completions/mean_length") == "mean"
    assert dist._kind("clip_ratio/high_mean") == "mean"


def test_parallel_modes():
    assert resolve_parallel("auto", 1) == "none"
    assert resolve_parallel("auto", 4) == "ddp"
    assert resolve_parallel("ddp", 4) == "ddp"
    with pytest.raises(ConfigError, match="train.parallel=none under 2 processes"):
        resolve_parallel("none", 2)
    with pytest.raises(ConfigError, match="train.parallel=fsdp needs a process group"):
        resolve_parallel("fsdp", 1)
