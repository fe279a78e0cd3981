"""The demo task's GRPO reward curve before and after the speed-ups, at the same number of samples.

1. The demo's tiny model (hidden 128, 2 layers) is SFT-trained briefly from scratch on
   3-digit addition until greedy dev accuracy reaches --sft-accuracy: a mediocre policy, as RL needs.
2. From that one model folder, the same short GRPO config and seed run in separate processes:
   ``after`` (this tree, bf16 fast path), ``fp32`` (this tree, model.autocast=none) and, with
   --before-rev, ``before`` (the code of that git revision, exported to a temporary folder); with --compile,
   ``compiled`` (this tree, bf16, model.compile=true: its compiling counts in its first step's time).
3. Prints reward per block of steps for each, and the samples seen.

    .venv/bin/python benchmarks/reward_curve.py --before-rev c66d413
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from common import scratch_dir, set_threads

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, sys, torch
torch.set_num_threads(int(sys.argv[2]))
from grpolab.config import load_config
from grpolab.commands.train import train
from grpolab.runtime.logging import read_metrics
result = train(load_config(None, json.loads(sys.argv[1])))
rows = read_metrics(result.run_dir)
print(json.dumps([[r["step"], r["reward"], r["sys/samples_seen"], r["sys/step_time_s"]] for r in rows]))
"""


def grpo_overrides(model: str, out: Path, name: str, a: argparse.Namespace) -> list[str]:
    """Keys that both the old and the new config schema know."""
    return [
        f"model.name_or_path={model}",
        "data.source=arithmetic",
        "data.size=4000",
        "data.params={digits: 3, reverse: false}",  # the demo SFT's task (src/grpolab/configs/demo.yaml)
        "rollout.num_generations=8",
        "rollout.max_completion_length=5",
        "algo.name=grpo",
        "algo.beta=0.04",
        "algo.mu=1",
        "reward.functions=[{name: exact_match, kwargs: {extract: none}}]",
        "optim.lr=1e-4",
        f"train.num_steps={a.steps}",
        "train.prompts_per_step=16",
        "train.micro_batch_size=128",
        f"log.output_dir={out}",
        f"log.run_name={name}",
        "log.checkpoint_every=0",
        "log.tensorboard=false",
        "log.progress=false",
        "seed=0",
    ]


def sft_model(out: Path, accuracy: float) -> str:
    from grpolab.commands.demo import demo_config
    from grpolab.commands.sft import sft
    from grpolab.tasks.tiny import save_tiny

    init = save_tiny(out / "init", hidden_size=128, num_layers=2, num_heads=4)
    cfg = demo_config(
        out / "sft_run",
        "full",
        [f"model.name_or_path={init}", f"sft.target_accuracy={accuracy}", "sft.check_every=10"],
    )
    result = sft(cfg, progress=False)
    print(f"SFT: {result.steps} steps, greedy dev accuracy {result.dev_accuracy}", flush=True)
    return str(result.output_dir)


def run(src: Path, overrides: list[str], threads: int) -> list[list[float]]:
    env = {**os.environ, "PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-c", CHILD, json.dumps(overrides), str(threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("[")]
    if done.returncode != 0 or not lines:
        sys.exit(f"GRPO run failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(lines[-1])


def export(rev: str, out: Path) -> Path:
    tar = subprocess.run(["git", "archive", rev, "src"], cwd=ROOT, capture_output=True, check=True).stdout
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=tar, check=True)
    return out / "src"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before-rev", default=None, help="git revision with the pre-speed-up code")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--block", type=int, default=10, help="steps per printed mean")
    p.add_argument("--sft-accuracy", type=float, default=0.3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sft-model", default=None, help="start GRPO from this folder instead of a fresh SFT")
    p.add_argument("--compile", action="store_true", help="also this tree with model.compile=true (bf16 fast path)")
    a = p.parse_args()
    set_threads(a.threads)
    out = scratch_dir("grpolab-curve-")
    model = a.sft_model or sft_model(out, a.sft_accuracy)
    runs = {"after (bf16 fast path)": (ROOT / "src", [])}
    runs["fp32 (autocast none)"] = (ROOT / "src", ["model.autocast=none"])
    if a.compile:
        runs["compiled (model.compile)"] = (ROOT / "src", ["model.compile=true"])
    if a.before_rev:
        runs[f"before ({a.before_rev})"] = (export(a.before_rev, out / "before"), [])
    curves = {}
    for i, (label, (src, extra)) in enumerate(runs.items()):
        print(f"GRPO: {label}", flush=True)
        curves[label] = run(src, grpo_overrides(model, out, f"grpo{i}", a) + extra, a.threads)
    print(f"\nreward, mean over blocks of {a.block} steps (16 prompts x 8 samples per step)")
    for label, rows in curves.items():
        blocks = [rows[i : i + a.block] for i in range(0, len(rows), a.block)]
        means = " ".join(f"{sum(r[1] for r in b) / len(b):.3f}" for b in blocks)
        step_time = sorted(r[3] for r in rows)[len(rows) // 2]
        print(f"{label:28s} {means}   samples {int(rows[-1][2])}, median step {step_time:.2f} s")


if __name__ == "__main__":
    main()
