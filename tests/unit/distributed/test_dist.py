"""The rank arithmetic of grpolab.distributed.dist (no process group: the helpers that only split work
are checked by setting the world they see)."""

from __future__ import annotations

import pytest

from grpolab.config import ConfigError
from grpolab.distributed import dist


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
    assert dist._kind("sys/peak_mem_mb") == dist._kind("sys/peak_reserved_train_mb") == "max"  # the worst rank


def test_cuda_process_group_has_gloo_for_host_tensors_and_a_configurable_timeout_and_device():
    import datetime

    import torch

    cuda = dist.init_kwargs("cuda", timeout_s=42.0, bind_device=True)
    assert cuda["backend"] == "cpu:gloo,cuda:nccl"  # a host tensor's collective must not reach NCCL
    assert cuda["timeout"] == datetime.timedelta(seconds=42)
    assert cuda["device_id"] == torch.device("cuda", 0)
    assert "device_id" not in dist.init_kwargs("cuda", timeout_s=1.0, bind_device=False)
    assert dist.init_kwargs("cpu", timeout_s=1.0, bind_device=True) == {"backend": "gloo", "timeout": datetime.timedelta(seconds=1)}
    from grpolab.config import load_config

    cfg = load_config(None, ["train.dist_timeout_s=1800", "train.dist_bind_device=false"])
    assert dist.session_options(cfg.train) == {"timeout_s": 1800.0, "bind_device": False}
    with pytest.raises(ConfigError, match="train.dist_timeout_s must be > 0"):
        load_config(None, ["train.dist_timeout_s=0"])


def _gather_worker(rank: int, port: int, out: str) -> None:
    import os

    import torch

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    with dist.session("cpu", timeout_s=60.0):
        flags = dist.gather_rows(torch.tensor([rank == 0, True]))
        rewards = dist.gather_rows(torch.tensor([0.5 + rank, -1.0]))
        side = _side_and_main(rank)
        if rank == 0:
            torch.save({"flags": flags, "rewards": rewards, "side": side}, out)


def _side_and_main(rank: int) -> dict[str, list[float]]:
    """A thread's collectives on ``dist.side_group`` while the main thread's run on the default group: on one
    group the two streams would pair up across ranks in whatever order they came (1 + 10 instead of 1 + 2)."""
    import threading

    group = dist.side_group()
    got: dict[str, list[float]] = {"thread": [], "main": []}

    def work() -> None:
        with dist.on_group(group):
            got["thread"] += [dist.all_reduce_sum(rank + 1.0) for _ in range(200)]

    thread = threading.Thread(target=work)
    thread.start()
    got["main"] = [dist.all_reduce_sum(10.0 * rank) for _ in range(200)]
    thread.join()
    dist.destroy_group(group)
    return got


def test_gather_rows_over_two_gloo_ranks_keeps_dtype_and_device_and_a_side_group_keeps_apart(tmp_path):
    import socket

    import torch
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "gathered.pt")
    mp.start_processes(_gather_worker, args=(port, out), nprocs=2, join=True, start_method="spawn")
    got = torch.load(out)
    assert got["flags"].dtype == torch.bool and got["flags"].tolist() == [True, True, False, True]
    assert got["rewards"].device.type == "cpu" and got["rewards"].tolist() == [0.5, -1.0, 1.5, -1.0]
    assert got["side"]["thread"] == [3.0] * 200 and got["side"]["main"] == [10.0] * 200
