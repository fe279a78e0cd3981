"""The held-out evaluation under sequence parallelism (train.sequence_parallel) on gloo: a sequence-parallel
group evaluates its share of the prompts once, by its first rank, and every rank of it returns what one
process computes on the same prompts (pass@K, maj@K, greedy accuracy, rewards, gold rewards, the kept
samples); 4 ranks as 2 x 2 (data x sequence) return what 2 data-parallel ranks do. With the policy sharded
by FSDP2 the other rank's ``take_part`` joins the first rank's layer gathers.

The other rank builds no sampling engine (the hf engine's ``Onlooker``, rollout/engines.py), never samples,
takes part once per batch the first rank samples, and never calls the reward (its calls are counted per rank
in files: toy_rewards.counted_digit_fraction)."""

from __future__ import annotations

import os

import pytest
import sequence_eval_cases as ec
import torch
import torch.multiprocessing as mp
from test_parallel_step import free_port

BATCHES = 3 + 1
"""5 prompts in batches of eval.prompts_per_batch=2 (3 samples), then one greedy batch."""


@pytest.fixture(scope="module")
def data(addition_jsonl):
    return str(addition_jsonl(16))


@pytest.fixture(scope="module")
def one(tiny_model_dir, data, tmp_path_factory):
    calls = tmp_path_factory.mktemp("calls_one")
    os.environ["GRPOLAB_TEST_REWARD_CALLS"] = str(calls)
    try:
        return ec.run_eval(tiny_model_dir, data, 1), calls
    finally:
        del os.environ["GRPOLAB_TEST_REWARD_CALLS"]


def _launch(model_dir: str, data: str, folder, world: int, n: int, modes: tuple) -> dict:
    os.environ["GRPOLAB_TEST_REWARD_CALLS"] = str(folder / "calls")  # the spawned ranks inherit it
    try:
        mp.start_processes(ec.worker, args=(world, free_port(), model_dir, data, str(folder / "out.pt"), n, modes),
                           nprocs=world, join=True, start_method="spawn")  # fmt: skip
    finally:
        del os.environ["GRPOLAB_TEST_REWARD_CALLS"]
    return torch.load(folder / "out.pt", weights_only=False)


@pytest.fixture(scope="module")
def two(tiny_model_dir, data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sequence_eval")
    return _launch(tiny_model_dir, data, folder, 2, 2, ("none", "fsdp")), folder / "calls"


@pytest.fixture(scope="module")
def grid(tiny_model_dir, data, tmp_path_factory):
    """(2 x 2 ranks, 2 data-parallel ranks without sequence parallelism), each rank's result."""
    sp = _launch(tiny_model_dir, data, tmp_path_factory.mktemp("grid"), 4, 2, ("none",))
    dp = _launch(tiny_model_dir, data, tmp_path_factory.mktemp("dp"), 2, 1, ("none",))
    return sp["none"], dp["none"]


def _same(got, want, where: str) -> None:
    if isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for k in want:
            _same(got[k], want[k], f"{where}/{k}")
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            _same(a, b, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-9, nan_ok=True), where
    else:
        assert got == want, where


@pytest.mark.parametrize("mode", ["none", "fsdp"])
def test_each_rank_of_a_group_returns_one_process_eval(one, two, mode):
    want = one[0]["eval"]
    assert want["num_prompts"] == 5 and 0 < want["reward_mean"] < 1  # graded samples, not all equal
    # a seeded random stream: another seed would draw other samples (the samples kept show 4 x 4 of them)
    assert 0 < want["pass_at"][1] < 1 and len({t for s in want["samples"] for t in s["sampled"]}) > 8
    for rank, got in enumerate(two[0][mode]):
        _same(got["eval"], want, f"{mode}/rank{rank}")


def test_only_the_groups_first_rank_samples_and_grades(one, two):
    ranks, calls = two
    assert ranks["none"][0]["calls"] == {"built": ["HFSampler", "HFSampler"], "sample": BATCHES}
    assert ranks["fsdp"][0]["calls"] == {"built": ["UnshardedSampler", "UnshardedSampler"], "sample": BATCHES}
    for mode in ("none", "fsdp"):  # no engine built, one take_part per sample of rank 0
        assert ranks[mode][1]["calls"] == {"built": ["Onlooker", "Onlooker"], "take_part": BATCHES}
    counted = {p.name: len(p.read_text().splitlines()) for p in calls.iterdir()}
    _, one_calls = one
    # per evaluation the reward graded 5 x 4 samples and 5 greedy replies, on rank 0 only, as one process did
    assert len((one_calls / "rank0").read_text().splitlines()) == 25 and counted == {"rank0": 2 * 25}


def test_two_by_two_ranks_return_two_data_parallel_ranks_eval(grid):
    sp, dp = grid
    assert dp[0]["eval"]["per_prompt"] != {}
    for rank, got in enumerate(sp):
        _same(got["eval"], dp[0]["eval"], f"rank{rank}")
    assert [r["calls"].get("sample", 0) for r in sp] == [3, 0, 2, 0]  # prompts 0..2 and 3..4, then greedy
