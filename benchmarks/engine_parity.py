"""GRPO with ``rollout.engine=vllm`` against ``rollout.engine=hf`` on the demo's task, from the same SFT model.

For each seed:

1. the demo's SFT stage (``grpolab.commands.demo``: the tiny model built in code, SFT to greedy dev accuracy
   0.3 checked every 10 steps, ``SFT_STOP``: the demo's stop when docs/vllm.md was measured), or the SFT
   folder already in ``<out>/seed<N>/sft`` (a previous run of this script);
2. the demo's GRPO stage from that one folder twice, ``rollout.engine=hf`` then ``rollout.engine=vllm``,
   every other key the demo's (``demo_config``: steps, seed, batch, lr, beta, mu);
3. both final policies evaluated by the demo's evaluation (``grpolab.commands.eval.evaluate``: the 200
   held-out problems, 64 samples at T = 1) with the hf engine, so the measurement itself is identical;
   ``--eval-vllm`` also evaluates them with the vllm engine.

Prints per run: GRPO wall time (vllm's includes the engine start-up), mean s/step, final pass@1,
maj@64, pass@64, and the mean over steps of ``sampling/sampling_logp_difference/mean`` (TRL's name:
mean |log pi_train - log pi_sampler| per token). Seeded sampling draws other tokens on each engine, so
the two agree only within seed noise (docs/demo.md: GRPO pass@1 0.28-0.54 across seeds).

    PYTHONPATH=src .venv/bin/python benchmarks/engine_parity.py [--seeds 0,1] [--steps N] [--out DIR]
                                                                [--eval-vllm] [--threads N] [--size tiny]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `grpolab demo` (cli.py): before torch loads

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from common import auto_threads, bench_dtype, dtype_name, set_threads  # noqa: E402

from grpolab.commands.demo import SIZES, demo_config  # noqa: E402

ENGINES = ("hf", "vllm")
LOGP_DIFF = "sampling/sampling_logp_difference/mean"


def cpu_model() -> str:
    """"AMD EPYC ... (family 26, model 2), avx512_bf16": the model name, family / model and bf16 flag."""
    info = Path("/proc/cpuinfo")
    fields: dict[str, str] = {}
    for line in info.read_text().splitlines() if info.exists() else []:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    if not fields:
        return platform.processor() or "unknown CPU"
    bf16 = "avx512_bf16" if "avx512_bf16" in fields.get("flags", "").split() else "no avx512_bf16"
    return f"{fields.get('model name')} (family {fields.get('cpu family')}, model {fields.get('model')}), {bf16}"


SFT_STOP = ["sft.target_accuracy=0.3", "sft.check_every=10"]
"""The SFT stop docs/vllm.md was measured with (the demo's then; the demo now stops earlier, docs/demo.md)."""


def sft_stage(out: Path, seed: int, size: str) -> tuple[str, str]:
    """(SFT model folder, how it was obtained): the demo's SFT stage, or its output of a previous run."""
    from grpolab.commands.packaged import with_model
    from grpolab.commands.sft import sft
    from grpolab.tasks.tiny import save_tiny

    base = demo_config(out / f"seed{seed}", size, [f"seed={seed}", *(SFT_STOP if size == "full" else [])])
    if (base.sft_dir / "config.json").exists() and not any(base.sft_dir.glob("checkpoints/*")):
        return str(base.sft_dir), "reused"
    # The full demo model at every size: the tiny one's head size (16) has no vLLM CPU attention kernel.
    init = save_tiny(base.run_dir / "init_model", seed=base.seed, **SIZES["full"][0])
    t0 = time.perf_counter()
    result = sft(with_model(base, init), resume=True)
    if result.stopped_by is not None:
        raise KeyboardInterrupt
    seconds = time.perf_counter() - t0
    return str(base.sft_dir), f"{result.steps} steps, greedy dev {result.dev_accuracy:.3f}, {seconds:.0f} s"


def grpo_stage(out: Path, seed: int, size: str, sft_dir: str, engine: str, steps: int | None):
    """(config, final checkpoint, wall seconds, metrics rows) of the demo's GRPO stage on ``engine``."""
    from grpolab.commands.train import train
    from grpolab.runtime.logging import read_metrics

    overrides = [f"seed={seed}", f"model.name_or_path={sft_dir}", f"rollout.engine={engine}", "log.progress=false"]
    overrides += [f"train.num_steps={steps}"] if steps else []  # fmt: skip
    cfg = demo_config(out / f"seed{seed}_{engine}", size, overrides)
    t0 = time.perf_counter()
    trained = train(cfg)
    seconds = time.perf_counter() - t0
    if trained.stopped_by is not None:
        raise KeyboardInterrupt
    final = trained.run_dir / "checkpoints" / f"step_{trained.final_step}"
    return cfg, str(final), seconds, read_metrics(trained.run_dir)


def evaluate_both(cfgs: dict, finals: dict, engine: str) -> dict:
    """engine -> ModelEval of each GRPO run's final policy, both sampled by ``engine`` (the hf run's config)."""
    from grpolab.commands.eval import evaluate

    cfg = cfgs["hf"]
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, engine=engine))
    out = cfg.run_dir.parent / f"{cfg.run_dir.name.rsplit('_', 1)[0]}_eval_{engine}"
    evals = evaluate(cfg, [finals[e] for e in ENGINES], labels=list(ENGINES), out_dir=out, progress=False)
    return dict(zip(ENGINES, evals, strict=True))


def summarize(seed: int, engine: str, seconds: float, rows: list[dict], ev, eval_engine: str) -> dict:
    mean = lambda key: sum(r[key] for r in rows if key in r) / max(1, sum(key in r for r in rows))  # noqa: E731
    n = max(ev.ks)
    return {
        "seed": seed, "engine": engine, "eval_engine": eval_engine, "steps": len(rows), "grpo_s": round(seconds, 1),
        "s_per_step": round(mean("sys/step_time_s"), 3), "generation_s": round(mean("sys/time_generation_s"), 3),
        "pass@1": round(ev.pass_at[1], 3), f"maj@{n}": round(ev.maj_at[n], 3), f"pass@{n}": round(ev.pass_at[n], 3),
        "logp_diff_mean": float(f"{mean(LOGP_DIFF):.3g}"), "final_reward": round(rows[-1]["reward"], 3),
    }  # fmt: skip


def print_table(results: list[dict]) -> None:
    n = next(k for k in results[0] if k.startswith("maj@")).split("@")[1]
    head = ["seed", "engine", "eval", "GRPO s", "s/step", "gen s/step", "pass@1", f"maj@{n}", f"pass@{n}", "|dlogp| mean"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in results:
        cells = [r["seed"], r["engine"], r["eval_engine"], f"{r['grpo_s']:.0f}", f"{r['s_per_step']:.2f}",
                 f"{r['generation_s']:.2f}", f"{r['pass@1']:.3f}", f"{r[f'maj@{n}']:.3f}", f"{r[f'pass@{n}']:.3f}",
                 f"{r['logp_diff_mean']:.2e}"]  # fmt: skip
        print("| " + " | ".join(str(c) for c in cells) + " |")


def run_seed(out: Path, seed: int, a: argparse.Namespace) -> list[dict]:
    from grpolab.rollout.vllm.engine import shutdown_engines

    sft_dir, how = sft_stage(out, seed, a.size)
    print(f"seed {seed}: SFT model {sft_dir} ({how})", flush=True)
    cfgs, finals, runs = {}, {}, {}
    for engine in ENGINES:
        cfgs[engine], finals[engine], seconds, rows = grpo_stage(out, seed, a.size, sft_dir, engine, a.steps)
        runs[engine] = (seconds, rows)
        print(f"seed {seed}: GRPO {engine}: {len(rows)} steps in {seconds:.0f} s; load average "
              f"{os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    results = []
    for eval_engine in ("hf", "vllm") if a.eval_vllm else ("hf",):
        evals = evaluate_both(cfgs, finals, eval_engine)
        results += [summarize(seed, e, *runs[e], evals[e], eval_engine) for e in ENGINES]
    shutdown_engines()  # the next seed's engine has other settings (its seed)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0", help="comma-separated demo seeds (default: 0)")
    p.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the demo's)")
    p.add_argument("--out", default="runs/engine_parity", help="folder of the runs (SFT models are reused)")
    p.add_argument("--eval-vllm", action="store_true", help="also evaluate both policies with the vllm engine")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: the idle cores)")
    p.add_argument("--size", default="full", choices=list(SIZES), help="tiny = the demo's smoke-run settings (on the full demo model)")
    a = p.parse_args()
    seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    threads = set_threads(a.threads or auto_threads())
    steps = a.steps or demo_config(a.out, a.size).train.num_steps
    print(f"CPU: {cpu_model()}, {os.cpu_count()} logical cores, {threads} thread(s); trainer dtype "
          f"{dtype_name(bench_dtype())}; load average {os.getloadavg()[0]:.1f} (a shared CPU skews every time)")  # fmt: skip
    print(f"demo GRPO, {steps} steps, seeds {seeds}; engines {', '.join(ENGINES)}", flush=True)
    out = Path(a.out)
    results = []
    for seed in seeds:
        results += run_seed(out, seed, a)
        (out / "engine_parity.json").write_text(json.dumps(results, indent=1))
    print_table(results)
    print(f"results: {out / 'engine_parity.json'}")


if __name__ == "__main__":
    main()
