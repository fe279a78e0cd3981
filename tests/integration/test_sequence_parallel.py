"""Sequence parallelism (train.sequence_parallel) on gloo: ranks that split every sequence make the update
one process makes on the same global batch.

2 ranks with N = 2 (one sequence-parallel group) and 4 ranks as 2 x 2 (data x sequence), for GRPO and
PPO, padded and packed (train.padding_free) micro-batches: the recomputed and reference log-probs (and
PPO's values and advantages) of each rank's rows, the loss, KL, entropy and gradient-norm metrics and the
updated policy (and value model) weights match the one process's to fp32 tolerance. SGD steps, so a
gradient off by a factor (a normaliser counted N times, a gradient averaged instead of summed over the
group) shows in the weights. Each job runs every case in one torch.multiprocessing launch.
"""

from __future__ import annotations

import parallel_cases as pc
import pytest
import sequence_cases as sc
import torch
import torch.multiprocessing as mp
from test_parallel_step import EXACT_METRICS, free_port


def _launch(model_dir: str, out, world: int, jobs: list) -> dict:
    mp.start_processes(
        sc.worker, args=(world, free_port(), model_dir, str(out), 2, jobs), nprocs=world, join=True, start_method="spawn"
    )
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def one(tiny_model_dir):
    return {case: sc.run_case(tiny_model_dir, *case, "none", 1) for case in sc.CASES}


@pytest.fixture(scope="module")
def two(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("sequence") / "two.pt"
    return _launch(tiny_model_dir, out, 2, [(case, "ddp") for case in sc.CASES])


@pytest.fixture(scope="module")
def grid(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("sequence") / "grid.pt"
    return _launch(tiny_model_dir, out, 4, sc.GRID_JOBS)


def _same_step(ref: dict, got: dict, rows: slice, start: dict) -> None:
    moved = max(float((ref["policy"][k] - start[k]).abs().max()) for k in start)
    assert moved > 1e-3  # the step changed the weights, so equal weights say something
    for k in start:
        torch.testing.assert_close(got["policy"][k], ref["policy"][k], atol=2e-6, rtol=1e-5, msg=k)
    if ref["value"] is not None:
        for k, v in ref["value"].items():
            torch.testing.assert_close(got["value"][k], v, atol=2e-6, rtol=1e-5, msg=k)
    for key, value in ref["batch"].items():
        if value is not None:
            torch.testing.assert_close(got["batch"][key], value[rows], atol=2e-6, rtol=1e-5, msg=key)
    for key in EXACT_METRICS:
        if key in ref["metrics"]:
            assert got["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-5, abs=1e-6), key


def _initial(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()


_ids = lambda v: ("+".join(v) or "-") if isinstance(v, tuple) else v  # noqa: E731


@pytest.mark.parametrize(("algo", "agg", "extra"), sc.CASES, ids=_ids)
def test_two_ranks_splitting_each_sequence_equal_one_process(one, two, tiny_model_dir, algo, agg, extra):
    case = (algo, agg, extra)
    assert one[case]["batch"]["ref_logprobs" if algo == "grpo" else "old_values"] is not None
    _same_step(one[case], two[(*case, "ddp")], slice(None), _initial(tiny_model_dir))


@pytest.mark.parametrize(("case", "mode"), sc.GRID_JOBS, ids=lambda v: _ids(v) if isinstance(v, str) else "+".join(map(_ids, v)))
def test_two_by_two_ranks_equal_one_process(one, grid, tiny_model_dir, case, mode):
    first_half = slice(0, pc.P // 2 * pc.G)  # rank 0 holds data-parallel rank 0's prompts
    _same_step(one[case], grid[(*case, mode)], first_half, _initial(tiny_model_dir))


def test_each_group_trains_on_its_first_ranks_draw(two, grid):
    assert two["shared"] == [(0, 0), (0, 0)]
    assert grid["shared"] == [(0, 0), (0, 0), (2, 2), (2, 2)]


@pytest.mark.parametrize(("attention", "kv", "packed"), sc.FORWARDS, ids=lambda v: str(v))
def test_the_split_forward_gives_one_process_log_probs_and_gradients(two, attention, kv, packed):
    ref, got = sc.forward_case(attention, kv, packed, 1), two[(attention, kv, packed)]
    torch.testing.assert_close(got["logprobs"], ref["logprobs"], atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(got["entropy"], ref["entropy"], atol=2e-6, rtol=1e-5)
    assert float(ref["logprobs"].abs().sum()) > 1 and all(g is not None for g in ref["grads"].values())
    for k, g in ref["grads"].items():
        torch.testing.assert_close(got["grads"][k], g, atol=2e-6, rtol=1e-5, msg=k)
