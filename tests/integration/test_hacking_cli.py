"""``grpolab hacking`` end to end on a tiny model: a beta x seed grid, each run logging gold, one report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from grpolab.runtime.logging import read_metrics


def _cli(*args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    return subprocess.run(
        [sys.executable, "-m", "grpolab", "hacking", *args], capture_output=True, text=True, env=env, cwd=cwd
    )


def test_hacking_runs_the_grid_and_writes_the_report(tiny_model_dir, addition_jsonl, tmp_path):
    overrides = [
        f"model.name_or_path={tiny_model_dir}",
        f"data.path={addition_jsonl(64)}",
        "reward.functions=[{name: 'toy_rewards:digit_fraction'}]",
        "reward.gold=[{name: exact_match}]",
        "rollout.num_generations=4",
        "rollout.max_completion_length=4",
        "train.prompts_per_step=2",
        "train.num_steps=2",
        "optim.lr=1e-3",
        f"log.output_dir={tmp_path}",
        "log.run_name=hack",
        "log.checkpoint_every=0",
        "log.progress=false",
        "log.tensorboard=false",
    ]
    done = _cli("--betas", "0,0.04", *overrides, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    out = tmp_path / "hack"
    for name in ("beta0_seed0", "beta0.04_seed0"):
        rows = read_metrics(out / name)
        assert len(rows) == 2 and all({"train/gold/exact_match", "train/kl_seq"} <= set(r) for r in rows)
    report = (out / "report.md").read_text()
    assert "beta = 0: hacked in" in report and "beta = 0.04: hacked in" in report
    assert "| beta0.04_seed0 | 0.04 | 0 |" in report and (out / "plots" / "hacking.png").exists()
    assert "report written to" in done.stdout


def test_hacking_without_a_gold_reward_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    """In this process (``python -m grpolab hacking`` runs the test above): the verb's check, main()'s line."""
    from grpolab.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["hacking", "reward.functions=[{name: exact_match}]"]) == 2
    assert capsys.readouterr().err.startswith("grpolab: error: grpolab hacking needs reward.gold")
