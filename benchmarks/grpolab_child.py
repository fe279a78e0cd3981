"""One grpolab GRPO run on the bench work, through the library (grpolab.commands.train.train with a
Config), timed from its own per-step metrics; prints one JSON line. Started by vs_trl.py."""

from __future__ import annotations

import argparse
import json
import os
import warnings
from pathlib import Path

from common import bench_prompts, peak_rss_mb, scratch_dir, set_threads


def bench_config(model: str, data: Path, out: Path, a: argparse.Namespace):
    from grpolab.config import load_config

    return load_config(
        None,
        [
            f"model.name_or_path={model}",
            f"model.autocast={a.autocast}",
            f"data.path={data}",
            "reward.functions=[{name: exact_match, kwargs: {extract: last_line}}]",
            "reward.dry_run_examples=0",
            f"rollout.num_generations={a.generations}",
            f"rollout.max_completion_length={a.max_tokens}",
            "rollout.temperature=1.0",
            f"train.prompts_per_step={a.prompts}",
            f"train.num_steps={a.warmup + a.steps}",
            f"train.micro_batch_size={a.micro_batch}",
            "algo.name=grpo",
            "algo.beta=0.04",
            "algo.mu=1",
            "algo.loss_agg=seq-mean-token-mean",
            "optim.lr=1e-5",
            f"log.output_dir={out}",
            "log.run_name=bench",
            "log.progress=false",
            "log.tensorboard=false",
            "log.samples_every=0",
            "log.checkpoint_every=0",
            "data.shuffle=false",
            *(["model.compile=true"] if a.compile else []),
        ],
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--autocast", default="auto", choices=["auto", "bf16", "none"])
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--compile", action="store_true", help="model.compile=true (its compiling falls in the warm-up)")
    a = p.parse_args()
    threads = set_threads(a.threads)
    warnings.filterwarnings("ignore")
    from grpolab.commands.train import train
    from grpolab.runtime.logging import read_metrics

    out = scratch_dir("grpolab-bench-run-")
    data = out / "prompts.jsonl"
    rows = bench_prompts(a.prompts * (a.warmup + a.steps))
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = train(bench_config(a.model, data, out, a))
    timed = read_metrics(result.run_dir)[a.warmup :]
    n = a.prompts * a.generations
    print(
        json.dumps(
            {
                "name": f"grpolab (autocast={a.autocast}, micro-batch {a.micro_batch}{', compiled' if a.compile else ''})",
                "threads": threads,
                "step_s": [r["sys/step_time_s"] for r in timed],
                "generation_s": [r["sys/time_generation_s"] for r in timed],
                "reference_s": [r["sys/time_reference_s"] for r in timed],
                "tokens": [int(round(r["completions/mean_length"] * n)) for r in timed],
                "completions_per_step": n,
                "peak_rss_mb": peak_rss_mb(),
                "pid": os.getpid(),
            }
        )
    )


if __name__ == "__main__":
    main()
