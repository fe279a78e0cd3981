"""The demo task's GRPO stage under each paper preset, from one SFT start, at equal samples drawn.

1. The demo's tiny model (hidden 128, 2 layers) is SFT-trained from scratch on reversed 3-digit addition
   until greedy dev accuracy reaches --sft-accuracy (the demo's SFT stage, grpolab/configs/demo.yaml).
2. From that one folder, the demo's GRPO stage runs once per preset (--presets) with the preset's own
   recipe (demo.yaml's explicit ``algo.mu: 2`` and ``beta`` are reset to null so each paper's values
   apply), the same seed, --prompts x G=16 completions per step and --steps steps. DAPO's dynamic
   sampling draws more completions per step; its run is cut at the last step whose completions drawn
   stay within the budget every other preset spends, so all rows see equal samples.
3. Prints, per preset, train/reward_mean_drawn (the reward of every completion sampled, filtered or
   not) averaged over blocks of --block steps' worth of samples, then pass@1 and maj@16 on the held-out
   prompts (16 samples each, T = 1).

    nice -n 10 .venv/bin/python benchmarks/variants.py --steps 40
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from common import scratch_dir, set_threads

PRESETS = ("grpo", "dr_grpo", "dapo", "gspo", "cispo")
G = 16


def sft_start(out: Path, accuracy: float) -> str:
    from grpolab.commands.demo import demo_config
    from grpolab.commands.sft import sft
    from grpolab.tasks.tiny import save_tiny

    init = save_tiny(out / "init", hidden_size=128, num_layers=2, num_heads=4)
    overrides = [f"model.name_or_path={init}", f"sft.target_accuracy={accuracy}", "sft.check_every=10"]
    cfg = demo_config(out / "sft_run", "full", overrides)  # check_every: as docs/presets.md measured
    result = sft(cfg, progress=False)
    print(f"SFT: {result.steps} steps, greedy dev accuracy {result.dev_accuracy}", flush=True)
    return str(result.output_dir)


def grpo_config(model: str, out: Path, preset: str, a: argparse.Namespace, steps: int):
    from grpolab.commands.demo import demo_config

    # num_minibatches must split the step's groups: DAPO's and CISPO's 16 need prompts % 16 == 0
    return demo_config(
        out / preset,
        "full",
        [
            f"model.name_or_path={model}",
            f"algo.name={preset}",
            "algo.mu=null",
            "algo.beta=null",
            f"train.num_steps={steps}",
            f"train.prompts_per_step={a.prompts}",
            f"rollout.num_generations={G}",
            f"log.checkpoint_every={1 if preset == 'dapo' else 0}",
            "log.keep_last=100000",
            "log.progress=false",
            "log.samples_every=0",
            f"eval.max_prompts={a.eval_prompts}",
            f"eval.num_samples={G}",
            "eval.greedy=false",
            *a.set,
        ],
    )


def run_preset(model: str, out: Path, preset: str, a: argparse.Namespace):
    """(metrics rows within the sample budget, the checkpoint at the budget, seconds)."""
    from grpolab.commands.train import train
    from grpolab.runtime.logging import read_metrics

    budget = a.steps * a.prompts * G
    t0 = time.perf_counter()
    result = train(grpo_config(model, out, preset, a, a.steps))
    rows = read_metrics(result.run_dir)
    drawn, kept = 0, []
    for r in rows:
        drawn += int(r.get("train/groups_drawn", a.prompts)) * G
        if drawn > budget and kept:
            break
        kept.append({**r, "drawn": drawn})
    step = kept[-1]["step"]
    return kept, result.run_dir / "checkpoints" / f"step_{step}", time.perf_counter() - t0


def curve(rows: list[dict], block: int) -> str:
    """Mean reward of the completions drawn, per block of ``block`` completions."""
    out, acc, edge = [], [], block
    for r in rows:
        acc.append(r["train/reward_mean_drawn"])
        if r["drawn"] >= edge:
            out.append(sum(acc) / len(acc))
            acc, edge = [], edge + block
    if acc:
        out.append(sum(acc) / len(acc))
    return " ".join(f"{x:.3f}" for x in out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40, help="GRPO steps of the non-dynamic presets (the budget)")
    p.add_argument("--prompts", type=int, default=16, help="prompts per step (a multiple of 16)")
    p.add_argument("--block", type=int, default=10, help="steps' worth of samples per printed mean")
    p.add_argument("--sft-accuracy", type=float, default=0.4)
    p.add_argument("--eval-prompts", type=int, default=200)
    p.add_argument("--presets", default=",".join(PRESETS))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sft-model", default=None, help="start from this folder instead of a fresh SFT")
    p.add_argument("--set", action="append", default=[], help="an extra override for every preset, e.g. algo.num_minibatches=1")
    a = p.parse_args()
    set_threads(a.threads)
    from grpolab.commands.eval import evaluate

    out = scratch_dir("grpolab-variants-")
    model = a.sft_model or sft_start(out, a.sft_accuracy)
    cfg0 = grpo_config(model, out, "grpo", a, a.steps)
    start = evaluate(cfg0, [model], labels=["SFT"], out_dir=out / "eval_sft", progress=False)[0]
    table = [("SFT start", "", 0, start.pass_at[1], start.maj_at[G], 0.0)]
    for preset in a.presets.split(","):
        print(f"GRPO stage: {preset}", flush=True)
        rows, ckpt, seconds = run_preset(model, out, preset, a)
        cfg = grpo_config(model, out, preset, a, a.steps)
        ev = evaluate(cfg, [str(ckpt)], labels=[preset], out_dir=out / f"eval_{preset}", progress=False)[0]
        label = preset + "".join(f" {o}" for o in a.set)
        table.append((label, curve(rows, a.block * a.prompts * G), rows[-1]["drawn"], ev.pass_at[1], ev.maj_at[G], seconds))
    print(f"\n{a.prompts} prompts x G={G} per step, budget {a.steps * a.prompts * G} completions drawn; "
          f"reward of the completions drawn, mean per {a.block * a.prompts * G} completions; "
          f"held-out {a.eval_prompts} prompts x {G} samples at T=1")  # fmt: skip
    print(f"| preset | reward by block | completions drawn | pass@1 | maj@{G} | wall s |")
    print("|---|---|---|---|---|---|")
    for name, curve_text, drawn, p1, maj, seconds in table:
        print(f"| {name} | {curve_text} | {drawn} | {p1:.3f} | {maj:.3f} | {seconds:.0f} |")


if __name__ == "__main__":
    main()
