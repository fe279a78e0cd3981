"""grpolab against TRL's GRPOTrainer on identical GRPO work, side by side (run by `make bench`).

The work: a Qwen2-style model of ~33.6M parameters (hidden 512, 8 layers, 8 heads, the character
tokenizer built in code) saved to a temporary folder; 4 prompts (3-digit additions) x 8 completions
per step, every completion exactly 64 tokens (the model cannot emit its EOS: common.save_bench_model);
beta 0.04, mu = 1, GRPO's sequence-mean-token-mean loss (TRL loss_type="grpo"); 1 warm-up step, then
5 timed steps. Each trainer runs in its own process, one after the other, with the same number of
intra-op threads; TRL in fp32 and, where grpolab runs bf16 (a CPU with native bf16 instructions,
common.bench_dtype), also in bf16 autocast (gradient checkpointing off, use_vllm False); the faster
TRL run is the one grpolab is compared with. On a CPU without bf16 everything runs in fp32 (emulated
bf16 runs ~20x slower than fp32 there: hours for the TRL bf16 run).

    .venv/bin/python benchmarks/vs_trl.py [--threads N] [--rounds R] [--before-rev REV [--no-trl]]

--compile runs today's grpolab with model.compile=true (the compiling falls in the warm-up step); with --before-rev
HEAD that is compiled against uncompiled in one run.

--before-rev REV also times grpolab as it was at commit REV (a temporary git worktree: its own
grpolab_child.py against its own src/), interleaved with today's in every round, and prints today's ratio to it by phase: a
speed regression is one command away (docs/speed.md keeps the dated table per CPU kind).

--threads auto (the default) uses the cores that the machine's load average leaves idle (at least
one): on a shared machine, more OpenMP threads than free cores makes every thread wait at each
barrier (measured here: 2 threads on 2 busy cores ran a step 5-10x slower than 1 thread).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch
from common import (
    auto_threads,
    available_cores,
    bench_dtype,
    bench_prompts,
    bf16_speed_ratio,
    checkout_of,
    child_env,
    dtype_name,
    median,
    peak_gflops,
    save_bench_model,
    scratch_dir,
    set_threads,
)

HERE = Path(__file__).parent


def run_child(script: str, args: list[str], src: Path | None = None) -> dict:
    """A child's JSON line; ``src``: an older commit's checkout, whose own child script (same arguments, same
    JSON line) runs against its own grpolab."""
    root = HERE.parent if src is None else src.parent
    cmd = [sys.executable, str(root / "benchmarks" / script), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=child_env(src), cwd=root)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.exit(f"{script} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(lines[-1])


def merge(runs: list[dict]) -> dict:
    """One runner's rounds together: all timed steps pooled, medians taken over them."""
    out = dict(runs[0])
    for key in ("step_s", "generation_s", "reference_s", "tokens"):
        out[key] = [x for r in runs for x in r[key]]
    out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    step, gen, ref = median(out["step_s"]), median(out["generation_s"]), median(out["reference_s"])
    out.update(
        step=step,
        gen=gen,
        ref=ref,
        train=step - gen - ref,
        completions_per_s=out["completions_per_step"] / step,
        tokens_per_s=median(out["tokens"]) / step,
    )
    return out


def model_flops(params: int, tokens_per_row: int, completion_tokens: int, rows: int) -> dict[str, float]:
    """Model FLOPs per step: 2*params*tokens per forward, 6*params*tokens for forward + backward."""
    seq = rows * tokens_per_row
    return {"gen": 2 * params * completion_tokens, "ref": 2 * params * seq, "train": 6 * params * seq}


def print_report(results: list[dict], *, threads: int, peak: float, dtype: str, flops: dict[str, float]) -> None:
    head = f"{'trainer':44s} {'compl/s':>8s} {'tok/s':>7s} {'s/step':>7s} {'gen':>6s} {'ref':>6s} {'train':>6s} {'RSS MB':>7s}"
    print(head)
    print("-" * len(head))
    for r in results:
        print(
            f"{r['name']:44s} {r['completions_per_s']:8.2f} {r['tokens_per_s']:7.0f} {r['step']:7.2f} "
            f"{r['gen']:6.2f} {r['ref']:6.2f} {r['train']:6.2f} {r['peak_rss_mb']:7.0f}"
        )
    ours, trl = results[0], [r for r in results if r["name"].startswith("TRL")]
    for r in (r for r in results if r["name"].startswith("grpolab @")):
        print(
            f"grpolab today / {r['name']}: completions/s x{ours['completions_per_s'] / r['completions_per_s']:.2f}, "
            f"generation x{r['gen'] / ours['gen']:.2f}, reference x{r['ref'] / ours['ref']:.2f}, "
            f"training x{r['train'] / ours['train']:.2f}, peak RSS x{ours['peak_rss_mb'] / r['peak_rss_mb']:.2f} "
            "(above 1: today is faster, or uses more memory for RSS)"
        )
    print(f"\ngenerated tokens per step: {sorted({t for r in results for t in r['tokens']})} (all runners)")
    for r in trl:
        print(
            f"grpolab / {r['name']}: completions/s x{ours['completions_per_s'] / r['completions_per_s']:.2f}, "
            f"generation x{r['gen'] / ours['gen']:.2f}, reference x{r['ref'] / ours['ref']:.2f}, "
            f"training x{r['train'] / ours['train']:.2f}, peak RSS x{ours['peak_rss_mb'] / r['peak_rss_mb']:.2f}"
        )
    if trl:
        best = max(trl, key=lambda r: r["completions_per_s"])
        ratio = ours["completions_per_s"] / best["completions_per_s"]
        rss_ok = ours["peak_rss_mb"] <= best["peak_rss_mb"]
        print(
            f"against the faster TRL ({best['name']}): x{ratio:.2f} completions/s; peak RSS {'<=' if rss_ok else '>'} TRL's"
        )
    mfu = {k: flops[k] / ours[k] / (peak * 1e9) for k in ("gen", "ref", "train")}
    total = sum(flops.values()) / ours["step"] / (peak * 1e9)
    print(
        f"grpolab model-FLOPs utilisation against the measured {dtype} matmul peak ({peak:.0f} GFLOP/s on {threads} "
        f"thread(s)): generation {mfu['gen']:.0%}, reference {mfu['ref']:.0%}, training {mfu['train']:.0%}, "
        f"whole step {total:.0%}"
    )


def machine() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "unknown CPU")
    return f"{model}, {available_cores()} cores available, load average {os.getloadavg()[0]:.1f}, {platform.python_version()}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", default="auto", help="intra-op threads for every runner, or auto")
    p.add_argument("--rounds", type=int, default=1, help="run every trainer this many times, pooling steps")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--micro-batch", type=int, default=16, help="grpolab's train.micro_batch_size")
    p.add_argument("--no-trl-fp32", action="store_true", help="skip TRL's fp32 run where TRL also runs bf16")
    p.add_argument("--before-rev", help="also time grpolab at this git commit (a worktree), in the same run")
    p.add_argument("--no-trl", action="store_true", help="skip TRL (with --before-rev: grpolab against itself)")
    p.add_argument("--compile", action="store_true", help="today's grpolab with model.compile=true (--before-rev's without)")
    a = p.parse_args()
    with checkout_of(a.before_rev) as before:
        run_all(a, before)


def run_all(a: argparse.Namespace, before: Path | None) -> None:
    threads = auto_threads() if a.threads == "auto" else int(a.threads)
    print(f"machine: {machine()}; threads per runner: {threads}", flush=True)
    set_threads(threads)
    dtype, ratio = bench_dtype(), bf16_speed_ratio()
    print(f"compute dtype: {dtype_name(dtype)} (bf16 matmul runs at x{ratio:.2f} of fp32 here)", flush=True)
    if (dtype == torch.bfloat16) != (ratio > 0.5):
        print("note: the CPU flags and the timed probe disagree about native bf16", flush=True)
    peak = peak_gflops(dtype)
    folder = scratch_dir("grpolab-bench-")
    model = save_bench_model(folder / "model")
    common_args = [
        "--model",
        model,
        "--threads",
        str(threads),
        "--steps",
        str(a.steps),
        "--warmup",
        str(a.warmup),
    ]
    ours = ["--micro-batch", str(a.micro_batch)]
    runners: list[tuple[str, list[str], Path | None]] = [("grpolab_child.py", ours + ["--compile"] * a.compile, None)]
    runners += [] if before is None else [("grpolab_child.py", ours, before)]
    bf16 = dtype == torch.bfloat16
    if not a.no_trl:
        runners += [] if a.no_trl_fp32 and bf16 else [("trl_child.py", [], None)]
        runners += [("trl_child.py", ["--bf16"], None)] if bf16 else []
    runs: list[list[dict]] = [[] for _ in runners]
    for round_ in range(a.rounds):  # interleaved, so a change in the machine's load hits every runner alike
        for i, (script, extra, src) in enumerate(runners):
            print(f"round {round_ + 1}/{a.rounds}: {script} {' '.join(extra)}{' @' + a.before_rev if src else ''}", flush=True)
            runs[i].append(run_child(script, common_args + extra, src))
    results = [merge(r) for r in runs]
    if before is not None:
        results[1]["name"] = f"grpolab @{a.before_rev}"
    from safetensors import safe_open

    with safe_open(str(folder / "model" / "model.safetensors"), "pt") as f:
        names = list(f.keys())  # noqa: SIM118 (safe_open is not iterable)
        params = sum(_numel(f.get_slice(k).get_shape()) for k in names)
    prompt_len = median([len(r["prompt"]) for r in bench_prompts(4)])  # one character per token
    completion = median(results[0]["tokens"])
    rows = results[0]["completions_per_step"]
    flops = model_flops(params, int(prompt_len + completion / rows), int(completion), rows)
    print(
        f"\nmodel: {params / 1e6:.1f}M parameters; steps timed per runner: {len(results[0]['step_s'])}; "
        f"medians over steps; seconds per step split into generation / reference / training (the rest)\n"
    )
    print_report(results, threads=threads, peak=peak, dtype=dtype_name(dtype), flops=flops)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


if __name__ == "__main__":
    main()
