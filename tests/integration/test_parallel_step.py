"""A 2-rank step (gloo, CPU) equals the 1-process step on the same global batch, under DDP and FSDP2.

For GRPO with each loss aggregation mode (and with a token budget that gives the ranks different numbers
of micro-batches), REINFORCE++ (batch-level advantage scaling) and PPO (critic,
whitened GAE advantages): the updated policy (and value model) weights, and the loss, KL and gradient
norm metrics, match the single process's to float tolerance. Both ranks run in one
torch.multiprocessing launch (every case, both modes) to pay the imports once.
"""

from __future__ import annotations

import socket

import parallel_cases as pc
import pytest
import torch
import torch.multiprocessing as mp

EXACT_METRICS = ("loss", "grad_norm", "kl", "entropy", "loss/value", "train/value_grad_norm")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("parallel") / "results.pt"
    mp.start_processes(
        pc.worker,
        args=(2, free_port(), tiny_model_dir, str(out), ("ddp", "fsdp")),
        nprocs=2,
        join=True,
        start_method="spawn",
    )
    two = torch.load(out, weights_only=False)
    one = {case: pc.run_case(tiny_model_dir, *case, "none") for case in pc.CASES}
    return one, two


def _initial(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
@pytest.mark.parametrize(("algo", "agg", "extra"), pc.CASES, ids=lambda v: ("+".join(v) or "-") if isinstance(v, tuple) else v)
def test_two_ranks_equal_one_process(results, tiny_model_dir, algo, agg, extra, mode):
    one, two = results
    ref, got = one[(algo, agg, extra)], two[(algo, agg, extra, mode)]
    start = _initial(tiny_model_dir)
    moved = max(float((ref["policy"][k] - start[k]).abs().max()) for k in start)
    assert moved > 1e-3  # the step changed the weights, so equal weights say something
    assert set(got["policy"]) >= set(start)
    for k in start:
        torch.testing.assert_close(got["policy"][k], ref["policy"][k], atol=2e-6, rtol=1e-5, msg=k)
    if ref["value"] is not None:
        for k, v in ref["value"].items():
            torch.testing.assert_close(got["value"][k], v, atol=2e-6, rtol=1e-5, msg=k)
    for key in EXACT_METRICS:
        if key in ref["metrics"]:
            assert got["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-5, abs=1e-6), key


def test_the_budget_case_gives_the_ranks_different_micro_batch_counts():
    """What makes the token-budget case above telling: before equalising, the ranks' shares split into
    different numbers of micro-batches under pc.BUDGET."""
    from grpolab.config import load_config
    from grpolab.training.microbatch import prompt_lengths_of, split_rows

    budget = load_config(None, list(pc.BUDGET)).train.max_tokens_per_micro_batch
    _, comps, _ = pc.global_batch()
    counts = []
    for rank in (0, 1):
        seq = [p * pc.G + g for p in range(rank * pc.P // 2, (rank + 1) * pc.P // 2) for g in range(pc.G)]
        lengths = comps.completion_mask[seq].sum(-1)
        prompts = prompt_lengths_of([comps.prompt_ids[i] for i in seq])
        counts.append(len(split_rows(torch.arange(len(seq)), lengths, 2, max_tokens=budget, prompt_lengths=prompts)))
    assert counts[0] != counts[1], counts


def test_the_episode_case_trains_fewer_tokens(results):
    """What makes the episodes case telling: its env tokens are out of the loss, so its step differs from
    the same batch with every token trained (and the 2-rank step above still equals one process's)."""
    one, _ = results
    plain, episodes = one[("grpo", "seq-mean-token-mean", ())], one[("grpo", "seq-mean-token-mean", pc.EPISODES)]
    diff = max(float((plain["policy"][k] - episodes["policy"][k]).abs().max()) for k in plain["policy"])
    assert diff > 1e-4
