"""GRPO with ``rollout.engine=vllm``: the engine's weights follow the trainer's every step, through a
resume, under LoRA, and in each rank of a 2-process torchrun job.

The proof is the logged sampler/trainer mismatch: with fp32 on both sides the engine's log-probs equal
the trainer's to ~1e-6 nats, and an engine left one update behind is off by ~1e-2 or more (lr 1e-2).
The in-process runs share one engine (same settings: the process keeps it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'grpolab[vllm]'; make test installs it)")

from grpolab.commands.train import train  # noqa: E402
from grpolab.config import load_config  # noqa: E402
from grpolab.runtime.logging import read_metrics  # noqa: E402

MISMATCH_KEY = "sampling/sampling_logp_difference/mean"  # TRL's name: mean |log pi_train - log pi_vllm| per token
IS_RATIO_KEY = "sampling/importance_sampling_ratio/mean"  # TRL's name: the TIS weight's mean
SYNCED = 1e-4
"""Mean |engine - trainer| log-prob per token when the weights are the same (fp32: ~1e-6)."""


def mismatch(row: dict) -> float:
    return row[MISMATCH_KEY]


@pytest.fixture(scope="module")
def model_dir(vllm_model_dir):
    return vllm_model_dir  # tests/conftest.py: the folder (and so the colocated engine) of every vLLM module


@pytest.fixture(scope="module", autouse=True)
def _free_engines():
    yield
    from grpolab.rollout.vllm.engine import shutdown_engines

    shutdown_engines()


def overrides(model_dir, data, out: Path, name: str, steps: int) -> list[str]:
    return [
        f"model.name_or_path={model_dir}", "model.autocast=none", f"data.path={data}", "data.max_prompt_length=16",
        "reward.functions=[{name: 'toy_rewards:digit_fraction'}]", "rollout.engine=vllm",
        "rollout.num_generations=4", "rollout.max_completion_length=6", "train.prompts_per_step=2",
        f"train.num_steps={steps}", "optim.lr=1e-2", "vllm.dtype=float32", "vllm.kv_cache_space_gb=0.0625",
        f"log.output_dir={out}", f"log.run_name={name}", "log.progress=false", "log.checkpoint_every=1",
    ]  # fmt: skip


def test_grpo_engine_follows_every_update_and_resumes(model_dir, addition_jsonl, tmp_path):
    data = addition_jsonl(16)
    tis = ["algo.rollout_correction=tis"]
    straight = read_metrics(train(load_config(None, [*overrides(model_dir, data, tmp_path, "a", 3), *tis])).run_dir)
    assert [r["step"] for r in straight] == [1, 2, 3]
    for row in straight:  # steps 2 and 3 sample after an update: the sync happened
        assert mismatch(row) < SYNCED
        assert abs(row[IS_RATIO_KEY] - 1.0) < 1e-3  # TIS weights from the engine's log-probs
    train(load_config(None, [*overrides(model_dir, data, tmp_path, "b", 2), *tis]))
    resumed = read_metrics(
        train(load_config(None, [*overrides(model_dir, data, tmp_path, "b", 3), *tis]), resume=True).run_dir
    )
    assert [r["step"] for r in resumed] == [1, 2, 3]
    assert mismatch(resumed[-1]) < SYNCED  # the engine took the resumed weights, not the base model's
    for key in ("reward", "loss"):
        assert resumed[-1][key] == pytest.approx(straight[-1][key], abs=1e-5), key


def test_lora_grpo_syncs_the_merged_adapter(model_dir, addition_jsonl, tmp_path):
    cfg = load_config(
        None, [*overrides(model_dir, addition_jsonl(16), tmp_path, "lora", 2), "model.lora.enabled=true", "model.lora.r=4"]
    )
    rows = read_metrics(train(cfg).run_dir)
    assert rows[-1]["step"] == 2 and all(mismatch(r) < SYNCED for r in rows)


def test_torchrun_two_ranks_one_engine_each(model_dir, addition_jsonl, tmp_path):
    from test_torchrun import free_port

    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(free_port()), "-m", "grpolab", "train",
        *overrides(model_dir, addition_jsonl(16), tmp_path, "ranks", 2), "train.parallel=fsdp",
    ]  # fmt: skip
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_metrics(tmp_path / "ranks")
    assert [r["step"] for r in rows] == [1, 2] and all(mismatch(r) < SYNCED for r in rows)


def test_eval_samples_with_the_engine(model_dir, addition_jsonl, tmp_path, monkeypatch):
    """``grpolab eval`` with rollout.engine=vllm: greedy completions equal the hf engine's."""
    from grpolab.commands.eval import evaluate
    from grpolab.rollout.vllm.engine import VLLMSampler

    temperatures = []
    sample = VLLMSampler.sample

    def counted(self, *args, **kwargs):
        temperatures.append(self.temperature)
        return sample(self, *args, **kwargs)

    monkeypatch.setattr(VLLMSampler, "sample", counted)

    extra = ["data.eval_size=4", "eval.num_samples=2", "eval.ks=[1,2]"]
    results = {}
    for engine in ("hf", "vllm"):
        cfg = load_config(
            None, [*overrides(model_dir, addition_jsonl(16), tmp_path, engine, 1), f"rollout.engine={engine}", *extra]
        )
        (result,) = evaluate(cfg, out_dir=tmp_path / engine, progress=False)
        results[engine] = result
    assert [s["greedy"] for s in results["vllm"].samples] == [s["greedy"] for s in results["hf"].samples]
    assert results["vllm"].num_prompts == 4 and results["vllm"].greedy_accuracy is not None
    assert set(temperatures) == {0.0, 1.0}  # sampled (eval.temperature) and greedy, both on the engine


def test_torchrun_sequence_parallel_idle_rank_builds_its_engine_but_never_loads_weights(model_dir, addition_jsonl, tmp_path):
    """train.sequence_parallel=2 on 2 ranks under FSDP2: rank 0 samples, rank 1's engine is built (vLLM's start-up
    is a collective of every rank) and idle (rollout/vllm/engine.py): it never loads weights, while its syncs'
    FSDP2 gathers line up with rank 0's, whose engine follows every update (the mismatch stays at fp32 noise)."""
    import re

    from test_torchrun import free_port

    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(free_port()), "--tee", "3", "-m", "grpolab", "--log-level", "DEBUG", "train",
        *overrides(model_dir, addition_jsonl(16), tmp_path, "sp", 2), "train.parallel=fsdp",
        "train.sequence_parallel=2", "train.dist_timeout_s=300",
    ]  # fmt: skip
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_metrics(tmp_path / "sp")
    assert [r["step"] for r in rows] == [1, 2] and all(mismatch(r) < SYNCED for r in rows)
    lines = (done.stdout + done.stderr).splitlines()

    def said(rank: int, text: str) -> int:
        return sum(1 for line in lines if re.match(rf"\[(default|rank){rank}\]:", line) and text in line)

    assert said(0, "vllm: engine started") == said(1, "vllm: engine started") == 1
    # rank 0: the first sample's pending weights, then after each of the 2 updates; rank 1: only the gathers
    assert said(0, "vllm: weights synced") == 3 and said(1, "vllm: weights synced") == 0
