"""GRPO end to end on a tiny model saved to a temporary folder: library, CLI, checkpoints, exact resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpolab.commands.train import train
from grpolab.config import load_config
from grpolab.runtime.checkpoint import latest_checkpoint
from grpolab.runtime.logging import read_metrics


@pytest.fixture(scope="module")
def dataset(addition_jsonl) -> Path:
    return addition_jsonl(64)


def _overrides(model_dir, dataset, out, name, steps) -> list[str]:
    return [
        f"model.name_or_path={model_dir}",
        f"data.path={dataset}",
        "reward.functions=[{name: exact_match}, {name: 'toy_rewards:digit_fraction'}]",
        "rollout.num_generations=4",
        "rollout.max_completion_length=4",
        "train.prompts_per_step=2",
        f"train.num_steps={steps}",
        "train.micro_batch_size=4",
        "optim.lr=1e-3",
        f"log.output_dir={out}",
        f"log.run_name={name}",
        "log.checkpoint_every=1",
        "log.progress=false",
        "algo.mu=2",
    ]


def test_grpo_trains_through_the_library(tiny_model_dir, dataset, tmp_path):
    cfg = load_config(None, _overrides(tiny_model_dir, dataset, tmp_path, "lib", 2))
    result = train(cfg)
    rows = read_metrics(result.run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert all(torch.isfinite(torch.tensor(r[k])) for k in ("loss", "kl", "grad_norm"))
        assert r["kl"] >= 0
        assert r["sys/samples_seen"] == r["step"] * 8
    assert rows[0]["loss/approx_kl_old"] > 0  # mu=2: the second pass sees a moved policy
    assert all(0 <= r[k] <= 1 for r in rows for k in ("clip_ratio/low_mean", "clip_ratio/high_mean"))
    samples = (result.run_dir / "samples.jsonl").read_text().splitlines()
    assert len(samples) == 2 * 8 and {"prompt", "completion", "reward", "advantage"} <= set(
        json.loads(samples[0])
    )
    last = latest_checkpoint(result.run_dir)
    assert (
        last.name == "step_2"
        and (last / "model.safetensors").exists()
        and (last / "trainer_state.pt").exists()
    )
    before, after = load_file(f"{tiny_model_dir}/model.safetensors"), load_file(last / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert (result.run_dir / "config.yaml").exists()
    assert {"rewards/exact_match/mean", "rewards/digit_fraction/mean"} <= set(rows[0])
    assert list((result.run_dir / "tb").iterdir())


def test_cli_trains_and_resume_matches_an_uninterrupted_run(tiny_model_dir, dataset, tmp_path):
    def start(name, steps, *extra):
        cmd = [
            sys.executable,
            "-m",
            "grpolab",
            "train",
            *_overrides(tiny_model_dir, dataset, tmp_path, name, steps),
        ]
        # One thread each, in all three runs (the same reduction order): the first two run together on two cores.
        path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
        env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
        return subprocess.Popen([*cmd, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def finish(proc, name):
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        return read_metrics(tmp_path / name)

    def cli(name, steps, *extra):
        return finish(start(name, steps, *extra), name)

    together = [start("straight", 3), start("resumed", 2)]
    try:
        straight = finish(together[0], "straight")
        finish(together[1], "resumed")
    finally:
        for proc in together:
            if proc.poll() is None:
                proc.kill()
    state2 = torch.load(tmp_path / "resumed/checkpoints/step_2/trainer_state.pt", weights_only=False)
    resumed = cli("resumed", 3, "--resume")
    assert [r["step"] for r in resumed] == [1, 2, 3]
    state3 = torch.load(tmp_path / "resumed/checkpoints/step_3/trainer_state.pt", weights_only=False)
    assert {int(s["step"]) for s in state2["optimizer"]["state"].values()} == {4}  # 2 steps x mu=2 updates
    # the optimizer continued from step 2's state: 6 updates in all, not 2
    assert {int(s["step"]) for s in state3["optimizer"]["state"].values()} == {6}
    timing = ("sys/",)
    for a, b in zip(straight, resumed, strict=True):
        keep = {k: v for k, v in a.items() if not k.startswith(timing)}
        assert keep == {k: v for k, v in b.items() if not k.startswith(timing)}, f"step {a['step']} differs"
