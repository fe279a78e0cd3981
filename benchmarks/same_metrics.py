"""Does a refactor change what training computes? Fixed-seed tiny runs, today's against an older commit's.

Each run trains the tiny model (Qwen2-style, hidden 64, 2 layers, 2 heads, the character tokenizer built
in code, as tests/conftest.py builds it) for a few steps on one-digit additions with a dense reward
(``digit_fraction`` below), through the command line (``python -m grpolab train``), once with today's
grpolab and once with the grpolab of ``--before-rev`` (a temporary git worktree, common.checkout_of; the
child imports that checkout's ``src`` first). Every run is on one thread (OMP_NUM_THREADS=1: the same
reduction order in both). The runs:

    grpo-hf           GRPO, the hf engine, mu=2, one process
    ppo-hf            PPO with its critic, the hf engine, one process
    grpo-vllm         GRPO, the vLLM engine (fp32), one process (only where vllm imports)
    grpo-hf-2ranks    as grpo-hf, 2 gloo ranks under torchrun (FSDP)
    ppo-hf-2ranks     as ppo-hf, 2 gloo ranks under torchrun (DDP)
    grpo-vllm-2ranks  as grpo-vllm, 2 gloo ranks, one engine each (only where vllm imports)

Each run's ``metrics.jsonl`` is compared with the older commit's step for step, key for key and value for
value (exact: the same code on the same seed gives the same bytes), ignoring only the keys in
``IGNORED`` (wall-clock timings and memory). One line per run: ``identical`` or the first differing
key and step.

    .venv/bin/python benchmarks/same_metrics.py --before-rev REV [--runs grpo-hf,ppo-hf] [--keep DIR]
    .venv/bin/python benchmarks/same_metrics.py --baseline DIR     # against a --keep folder of an earlier run

--keep DIR writes every run's metrics.jsonl under DIR/today/<run>/ and DIR/before/<run>/, so a baseline
taken once (``--before-rev REV --keep DIR``) serves later comparisons (``--baseline DIR`` reads
DIR/before/). Exit status 1 when any run differs or fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from common import checkout_of, child_env, scratch_dir

HERE = Path(__file__).resolve().parent

TIMING = frozenset(
    {
        "sys/step_time_s",
        "sys/time_generation_s",
        "sys/time_generator_idle_s",
        "sys/time_reference_s",
        "sys/time_scoring_s",
        "sys/time_scoring_wait_s",
        "sys/time_sync_wait_s",
        "sys/time_trainer_wait_s",
        "sys/time_training_s",
        "sys/time_value_forward_s",
        "sys/time_value_update_s",
        "sys/time_weight_sync_s",
    }
)
"""Wall-clock seconds: they differ between any two runs."""

MEMORY = frozenset(
    {"sys/peak_mem_mb", "sys/peak_reserved_mb"}
    | {f"sys/peak_{kind}_{phase}_mb" for kind in ("mem", "reserved") for phase in ("rollout", "reference", "train")}
)
"""Peak memory (process RSS on a CPU): it depends on the allocator and on what else the process holds."""

IGNORED = TIMING | MEMORY

GRPO = ["algo.mu=2", "train.micro_batch_size=4"]
PPO = ["algo.name=ppo", "algo.mu=2", "algo.value_lr=3e-3", "train.micro_batch_size=4"]
VLLM = ["rollout.engine=vllm", "vllm.dtype=float32", "vllm.kv_cache_space_gb=0.0625", "model.autocast=none"]

RUNS: dict[str, tuple[int, list[str]]] = {
    "grpo-hf": (1, GRPO),
    "ppo-hf": (1, PPO),
    "grpo-vllm": (1, GRPO + VLLM),
    "grpo-hf-2ranks": (2, [*GRPO, "train.parallel=fsdp"]),
    "ppo-hf-2ranks": (2, [*PPO, "train.parallel=ddp"]),
    "grpo-vllm-2ranks": (2, [*GRPO, *VLLM, "train.parallel=fsdp"]),
}
"""Run name: (processes, the run's own overrides on top of ``common_overrides``)."""


def digit_fraction(completion, example) -> float:
    """Fraction of the completion's characters that are digits: a dense reward, so a random tiny model's
    groups have spread and every step has a gradient (tests/integration/toy_rewards.py's)."""
    text = completion.text
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


def common_overrides(model: Path, data: Path, out: Path, name: str, steps: int) -> list[str]:
    return [
        f"model.name_or_path={model}", f"data.path={data}", "data.max_prompt_length=16",
        "reward.functions=[{name: 'same_metrics:digit_fraction'}]", "rollout.num_generations=4",
        "rollout.max_completion_length=6", "train.prompts_per_step=2", f"train.num_steps={steps}", "optim.lr=1e-2",
        f"log.output_dir={out}", f"log.run_name={name}", "log.progress=false", "log.tensorboard=false",
        "log.checkpoint_every=0",
    ]  # fmt: skip


def vllm_importable() -> bool:
    return subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True).returncode == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_inputs(folder: Path) -> tuple[Path, Path]:
    """The tiny model and 32 one-digit additions, built once with today's grpolab (both sides read them)."""
    code = (
        "import json, sys\n"
        "from grpolab.tasks.tiny import save_tiny\n"
        "from grpolab.tasks.arithmetic import arithmetic_examples\n"
        "save_tiny(sys.argv[1], hidden_size=64, num_layers=2, num_heads=2)\n"
        "rows = arithmetic_examples(size=32, seed=0, digits=1)\n"
        "open(sys.argv[2], 'w').write(''.join(json.dumps({'prompt': e.prompt, 'answer': e.answer}) + '\\n' for e in rows))\n"
    )
    model, data = folder / "model", folder / "data.jsonl"
    env = child_env(HERE.parent / "src")
    subprocess.run([sys.executable, "-c", code, str(model), str(data)], check=True, env=env, capture_output=True)
    return model, data


def train(src: Path | None, name: str, model: Path, data: Path, out: Path, steps: int) -> Path | str:
    """One run with ``src``'s grpolab (None: today's); the run folder, or why it failed."""
    procs, extra = RUNS[name]
    args = ["-m", "grpolab", "train", *common_overrides(model, data, out, name, steps), *extra]
    if procs > 1:
        launcher = ["-m", "torch.distributed.run", f"--nproc_per_node={procs}", "--master_addr=127.0.0.1",
                    f"--master_port={free_port()}"]  # fmt: skip
        args = [*launcher, *args]
    env = child_env(src if src is not None else HERE.parent / "src")
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(HERE)])  # the reward: same_metrics:digit_fraction
    env.update(OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1")
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=out)
    if done.returncode != 0:
        return f"failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:] or ''}"
    return out / name


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def first_difference(today: list[dict], before: list[dict]) -> str:
    """``identical``, or the first step and key whose value differs (IGNORED keys aside)."""
    for a, b in zip(today, before, strict=False):  # a length difference is reported below
        keys = sorted((set(a) | set(b)) - IGNORED)
        for key in keys:
            if key not in a or key not in b:
                return f"step {b.get('step', a.get('step'))}: key {key!r} only {'before' if key in b else 'today'}"
            if a[key] != b[key]:
                return f"step {a.get('step')}: {key} = {a[key]!r} today, {b[key]!r} before"
    if len(today) != len(before):
        return f"{len(today)} steps today, {len(before)} before"
    return f"identical ({len(today)} steps)"


def run_all(a: argparse.Namespace, before_src: Path | None) -> int:
    work = scratch_dir("grpolab-same-")
    model, data = make_inputs(work)
    bad = 0
    for name in a.runs:
        metrics: dict[str, list[dict] | str] = {}
        for side, src in (("today", None), ("before", before_src)):
            if side == "before" and a.baseline:
                saved = a.baseline / "before" / name / "metrics.jsonl"
                metrics[side] = read_rows(saved) if saved.exists() else f"no {saved}"
                continue
            out = work / side
            out.mkdir(exist_ok=True)
            run = train(src, name, model, data, out, a.steps)
            metrics[side] = run if isinstance(run, str) else read_rows(run / "metrics.jsonl")
            if a.keep and not isinstance(run, str):
                (a.keep / side / name).mkdir(parents=True, exist_ok=True)
                shutil.copy(run / "metrics.jsonl", a.keep / side / name / "metrics.jsonl")
        today, before = metrics["today"], metrics["before"]
        if isinstance(today, str) or isinstance(before, str):
            line = f"today {today if isinstance(today, str) else 'ran'}; before {before if isinstance(before, str) else 'ran'}"
        else:
            line = first_difference(today, before)
        bad += not line.startswith("identical")
        print(f"{name:18s} {line}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 1 if bad else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--before-rev", help="compare with grpolab at this git commit (a temporary worktree)")
    group.add_argument("--baseline", type=Path, help="compare with the before/ runs a --keep folder holds")
    p.add_argument("--runs", help=f"comma-separated, of {', '.join(RUNS)} (default: all; vLLM where it imports)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--keep", type=Path, help="write every run's metrics.jsonl under this folder")
    a = p.parse_args()
    if a.runs:
        a.runs = a.runs.split(",")
        unknown = [r for r in a.runs if r not in RUNS]
        if unknown:
            sys.exit(f"--runs: unknown {unknown}; known: {', '.join(RUNS)}")
    else:
        a.runs = [r for r in RUNS if "vllm" not in r or vllm_importable()]
    with checkout_of(a.before_rev) as before:
        sys.exit(run_all(a, before))


if __name__ == "__main__":
    main()
