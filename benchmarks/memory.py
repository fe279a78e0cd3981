"""Peak memory of one GRPO step: grpolab before (20ce92a) and after the chunked head / token-budget
micro-batches, and TRL's GRPOTrainer, on a model with Qwen2.5-0.5B's vocabulary (151,936) and hidden
size (896) but 2 layers; G = 8 completions of 256, 1,024 and 4,096 tokens (beta = 0: no reference model,
mu = 1, AdamW, fp32). Each configuration runs in its own process; grpolab's runs use fixed-length
completions (the step alone), TRL generates with min_new_tokens = the length.

Before running a configuration its peak is predicted, and it is skipped with the reason printed when
the prediction passes --limit-gb (the machine is shared) or its arithmetic passes --max-tflop:

    peak ~ runtime + max(backward: weights + grads + activations + full-logits copies,
                         optimizer step: weights + grads + AdamW states (+ foreach temporaries))

grpolab's training step hands glibc's freed heap back before its biggest allocations (grpolab.distributed.host);
--trl-malloc adds TRL runs with glibc's mmap threshold at 1 MiB for the whole process (through the
MALLOC_MMAP_THRESHOLD_ environment variable), which gives TRL's freed activations back too, so the share
of the ratio that comes from malloc shows.

Usage: nice -n 10 python benchmarks/memory.py [--lengths 256,1024,4096] [--limit-gb 8] [--max-tflop 14] [--trl-malloc]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BEFORE = "20ce92a"
V, H, LAYERS, MLP, KV_DIM = 151936, 896, 2, 4864, 128
PROMPT, G = 32, 8
PARAMS = V * H + LAYERS * (2 * H * H + 2 * H * KV_DIM + 3 * H * MLP)  # tied head; norms and biases left out
ACT_PER_TOKEN = LAYERS * (10 * H + 4 * MLP) * 4  # bytes a layer keeps for the backward, per token (fp32)
RUNTIME = 0.7e9  # python, torch, transformers
GB = 1e9


def predict(kind: str, tokens: int, budget: int | None, checkpointing: bool = False) -> float:
    """Predicted peak bytes of one step (see the module docstring)."""
    row = PROMPT + tokens
    rows = G if budget is None else max(1, min(G, budget // row))
    act = rows * row * (LAYERS * H * 4 + ACT_PER_TOKEN // LAYERS if checkpointing else ACT_PER_TOKEN)
    kind = "trl" if kind.startswith("trl") else kind
    logits = {"before": 4 * G * tokens * V * 4, "after": 3 * 2**26, "trl": 3 * 2**26}[kind]
    step_temps = 8 * PARAMS if kind == "before" else 0  # foreach AdamW before; fused after and in TRL
    backward = 8 * PARAMS + act + logits
    return RUNTIME + max(backward, 16 * PARAMS + step_temps)


def tflop(tokens: int, kind: str) -> float:
    """Arithmetic of the step (and of generation for TRL), in TFLOP."""
    kind = "trl" if kind.startswith("trl") else kind
    n = G * (PROMPT + tokens)
    body = LAYERS * (2 * H * H + 2 * H * KV_DIM + 3 * H * MLP)
    head = {"before": 3, "after": 4, "trl": 4}[kind]  # the chunked heads recompute the logits in the backward
    work = n * (6 * body + 2 * head * H * V)
    if kind == "trl":
        work += G * tokens * 2 * (body + H * V)  # decoding
    return work / 1e12


def extract_before(tmp: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE, "src"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
    return tmp / "src"


def run_child(script: str, src: Path, args: list[str], env: dict | None = None) -> dict:
    env = {**os.environ, **(env or {}), "PYTHONPATH": f"{src}{os.pathsep}{HERE}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(HERE / script), *args], env=env, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def configurations(lengths, budget, trl_malloc: bool):
    """Most telling first (a shared CPU runs these slowly): after, before, TRL per length (and TRL with
    grpolab's malloc setting), then checkpointing at the first length (its saving shows in the forward +
    backward peak)."""
    for t in lengths:
        yield "grpolab after", "after", t, budget, False
        yield "grpolab before", "before", t, None, False
        yield "TRL GRPOTrainer", "trl", t, None, False
        if trl_malloc:
            yield "TRL GRPOTrainer, MALLOC_MMAP_THRESHOLD_=1MiB", "trl-malloc", t, None, False
    yield "grpolab after + checkpointing", "after", lengths[0], budget, True


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", default="256,1024,4096")
    p.add_argument("--limit-gb", type=float, default=8 * 2**30 / GB)
    p.add_argument("--max-tflop", type=float, default=14.0)
    p.add_argument("--budget", type=int, default=4096 + PROMPT, help="train.max_tokens_per_micro_batch (after)")
    p.add_argument(
        "--trl-malloc", action="store_true",
        help="also run TRL with glibc's mmap threshold at 1 MiB, the setting grpolab makes (grpolab.distributed.host)",
    )
    a = p.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        before_src = extract_before(Path(tmp))
        rows = []
        for name, kind, t, budget, ckpt in configurations(lengths, a.budget, a.trl_malloc):
            pred = predict(kind, t, budget, ckpt) / GB
            work = tflop(t, kind)
            if pred > a.limit_gb:
                rows.append((name, t, pred, None, f"skipped: predicted {pred:.1f} GB > {a.limit_gb:.1f} GB limit"))
            elif work > a.max_tflop:
                rows.append((name, t, pred, None, f"skipped: {work:.0f} TFLOP > --max-tflop {a.max_tflop:g}"))
            else:
                args = ["--tokens", str(t), "--generations", str(G)]
                if kind.startswith("trl"):
                    env = {"MALLOC_MMAP_THRESHOLD_": str(2**20)} if kind == "trl-malloc" else None
                    out = run_child("memory_trl_child.py", ROOT / "src", args, env)
                else:
                    if kind == "after":
                        args += ["--max-tokens-per-micro-batch", str(budget)]
                    args += ["--gradient-checkpointing"] if ckpt else []
                    out = run_child("memory_child.py", before_src if kind == "before" else ROOT / "src", args)
                rows.append((name, t, pred, out, out.get("error", "")))
            print(_row(*rows[-1]), flush=True)
    print()
    print(f"CPU: {_cpu()}; peak RSS in GB; G = {G}, prompt {PROMPT} tokens, V = {V}, hidden {H}, {LAYERS} layers")
    print(
        "| configuration | completion tokens | predicted GB | peak RSS GB | forward+backward peak RSS GB "
        "| GPU max-allocated GB | loss | grad norm | note |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(_row(*r))


def _row(name, t, pred, out, note) -> str:
    out = out or {}
    rss = f"{out['peak_rss_mb'] / 1024 * 2**30 / GB:.2f}" if "peak_rss_mb" in out else "-"
    fb = f"{out['forward_backward_peak_mb'] / 1024 * 2**30 / GB:.2f}" if "forward_backward_peak_mb" in out else "-"
    gpu = f"{out['gpu_peak_mb'] / 1024 * 2**30 / GB:.2f}" if "gpu_peak_mb" in out else "-"
    loss = f"{out['loss']:.6f}" if "loss" in out else "-"
    norm = f"{out['grad_norm']:.6f}" if "grad_norm" in out else "-"
    return f"| {name} | {t} | {pred:.1f} | {rss} | {fb} | {gpu} | {loss} | {norm} | {note} |"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores, 1 thread per run)"
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    main()
