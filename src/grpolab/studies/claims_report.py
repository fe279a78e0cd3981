"""``claims.md``: a section per claim with its table, figure and verdict (studies/claims_verdicts.py).

Reads only what studies/claims.py measured (ClaimsData); the numbers of each sentence are computed
here, never written in advance. Plots (matplotlib, PNG) go to ``<run>/plots/``; ``claims.json`` holds the
verdicts and the numbers behind them (the README's table is copied from it).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path
from typing import Any

from grpolab import jsonio
from grpolab.config import Config
from grpolab.eval.report import add_caption, save_figure
from grpolab.models.inference import available_cpus
from grpolab.runtime.logging import read_metrics
from grpolab.studies.claims_data import ClaimsData, g_run, run_name, seeds, setup_line
from grpolab.studies.claims_pass_maj import pass_maj_section
from grpolab.studies.claims_verdicts import (
    Verdict,
    critic_verdict,
    group_verdict,
    hacking_verdict,
    kl_verdict,
    spread,
)
from grpolab.studies.hacking_analysis import GoldChange, HackingNumbers, analyse, gold_change

CLAIMS = {
    1: "GRPO removes the critic, and only it",
    2: "The group is the baseline, paid for in generation",
    3: "The KL moves into the loss, with k3: unbiased and never negative",
    4: "RL sharpens, it does not widen (Maj@K rises, Pass@K at large K does not)",
    5: "Neural reward models get hacked",
}


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(vals) if vals else math.nan


# --- claim 1 --------------------------------------------------------------------------------------------

def kl_end(rows: list[dict[str, Any]]) -> float:
    """The logged KL to the reference over the last fifth of a run's steps: nats per token, by the run's own
    estimator (algo.kl_estimator: GRPO's k3, PPO's k1, which a single step can put below 0)."""
    return _mean(rows[-max(1, len(rows) // 5) :], "kl")


def critic_section(data: ClaimsData, plots: Path) -> tuple[Verdict, list[str]]:
    cfg = data.cfg
    grpo = [{**data.runs[run_name("grpo", s)], "seed": s, **_load(data, run_name("grpo", s))} for s in seeds(cfg)]
    ppo = [{**data.runs[run_name("ppo", s)], "seed": s, **_load(data, run_name("ppo", s))} for s in seeds(cfg)]
    evs = [[r.get("train/value_explained_var", math.nan) for r in p["rows"]] for p in ppo]
    verdict = critic_verdict(grpo, ppo, evs)
    phases = ["generation", "scoring", "reference", "value_forward", "policy_update", "value_update"]
    lines = [
        "| | seed | models loaded | parameters (policy / value / total) | peak memory | s per step | "
        + " | ".join(p.replace("_", " ") for p in phases) + " | reward (first -> last fifth) | KL at the end |",
        "|---|---|---|---|---|---|" + "---|" * len(phases) + "---|---|",
    ]
    for name, rows in (("GRPO", grpo), ("PPO", ppo)):
        for row in rows:
            params = (f"{row['params_policy'] / 1e6:.1f}M / {_fmt((row.get('params_value') or 0) / 1e6, 1)}M / "
                      f"{row['params_total'] / 1e6:.1f}M")
            lines.append(
                f"| {name} | {row['seed']} | {', '.join(row['models_loaded'])} | {params} | {_fmt(row['peak_mem_mb'], 0)} MB | "
                f"{_fmt(row['time_step_s'], 2)} | " + " | ".join(_fmt(row.get(f"time_{p}_s"), 2) for p in phases)
                + f" | {_fmt(row['reward_first'])} -> {_fmt(row['reward_last'])} | {_fmt(kl_end(row['rows']), 4)} |"
            )
    _plot_critic(grpo[0], ppo[0], evs, plots / "ppo_vs_grpo.png", setup_line(cfg, data.warm_start))
    lines += ["", "![PPO against GRPO](plots/ppo_vs_grpo.png)", "",
              "Times are means over steps 2.. in seconds; peak memory is the process's RSS on a CPU (max allocated on a "
              "GPU); KL at the end: the logged KL to the reference, nats per token, over the last fifth of the steps, by "
              "each run's estimator (GRPO k3, PPO k1: an estimate that can read below 0). "
              "The figure's bars are the first seed's; its curves every seed's."]
    return verdict, lines


def _plot_critic(grpo, ppo, evs, path: Path, caption: str) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    axes[0].bar(["GRPO", "PPO"], [grpo["peak_mem_mb"] or 0, ppo["peak_mem_mb"] or 0], color=["C0", "C1"])
    axes[0].set_ylabel("peak memory, MB")
    bottom = [0.0, 0.0]
    for i, phase in enumerate(["generation", "scoring", "reference", "value_forward", "policy_update", "value_update"]):
        vals = [grpo.get(f"time_{phase}_s") or 0.0, ppo.get(f"time_{phase}_s") or 0.0]
        axes[1].bar(["GRPO", "PPO"], vals, bottom=bottom, color=f"C{i}", label=phase.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    axes[1].set_ylabel("seconds per step")
    axes[1].legend(fontsize=7)
    for ev in evs:
        axes[2].plot(range(1, len(ev) + 1), ev, "o-", color="C1", alpha=0.7)
    axes[2].set_xlabel("PPO step")
    axes[2].set_ylabel("critic explained variance")
    axes[2].grid(alpha=0.3)
    _save(fig, plt, path, caption)


def _load(data: ClaimsData, run: str) -> dict[str, Any]:
    """A timed run's name, its stage's load average at the end and the cores (claims_verdicts.shared_runs)."""
    return {"name": run, "load": data.loads.get(f"train {run}"), "cores": available_cpus()}


# --- claim 2 --------------------------------------------------------------------------------------------

def group_rows(data: ClaimsData) -> list[dict[str, Any]]:
    """One row per G and seed: the price (time, memory), the signal (groups without spread), the gain."""
    cfg = data.cfg
    rows = []
    for seed in seeds(cfg):
        base = data.evals[f"greedy/base_s{seed}"].greedy_accuracy or 0.0
        for g in sorted(cfg.claims.group_sizes):
            run, after = data.runs[g_run(cfg, g, seed)], data.evals[f"greedy/G{g}_s{seed}"].greedy_accuracy or 0.0
            minutes = sum(r.get("sys/step_time_s", 0.0) for r in run["rows"]) / 60
            rows.append({
                "g": g, "seed": seed, "time_step_s": run["time_step_s"], "time_generation_s": run["time_generation_s"],
                "peak_mem_mb": run["peak_mem_mb"], "zero_spread": _mean(run["rows"], "frac_reward_zero_std"),
                "groups": len(run["rows"]) * cfg.train.prompts_per_step, "greedy_before": base, "greedy_after": after,
                "train_min": minutes, "gain_per_min": (after - base) / minutes if minutes else math.nan,
                "kl_end": kl_end(run["rows"]), **_load(data, g_run(cfg, g, seed)),
            })
    return rows


def group_section(data: ClaimsData, plots: Path) -> tuple[Verdict, list[str]]:
    rows = group_rows(data)
    gs = sorted({r["g"] for r in rows})

    def cell(g: int, key: str, fmt: str) -> str:
        return spread([r[key] for r in rows if r["g"] == g]).text(fmt)

    lines = ["| G | s per step | generation s | peak memory, MB | groups without spread | greedy before -> after | "
             "training minutes | gain per minute | KL at the end |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [
        f"| {g} | {cell(g, 'time_step_s', '.2f')} | {cell(g, 'time_generation_s', '.2f')} | {cell(g, 'peak_mem_mb', '.0f')} | "
        f"{cell(g, 'zero_spread', '.2f')} | {cell(g, 'greedy_before', '.3f')} -> {cell(g, 'greedy_after', '.3f')} | "
        f"{cell(g, 'train_min', '.1f')} | {cell(g, 'gain_per_min', '+.3f')} | {cell(g, 'kl_end', '.4f')} |"
        for g in gs
    ]
    n = data.evals[f"greedy/base_s{data.cfg.seed}"].num_prompts
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    for ax, key, label in ((axes[0], "time_step_s", "seconds per step"), (axes[1], "zero_spread", "groups without spread"),
                           (axes[2], "gain_per_min", "greedy gain per minute")):
        s = [spread([r[key] for r in rows if r["g"] == g]) for g in gs]
        ax.errorbar(gs, [x.mean for x in s], yerr=[[x.mean - x.low for x in s], [x.high - x.mean for x in s]], fmt="o-",
                    capsize=3)
        ax.set_xscale("log", base=2)
        ax.set_xticks(gs, [str(g) for g in gs])
        ax.set_xlabel("G")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    _save(fig, plt, plots / "group_size.png", setup_line(data.cfg, data.warm_start))
    lines += ["", "![G](plots/group_size.png)", "",
              f"Each cell: the mean over the seeds, and its range in brackets (bars in the figure). Greedy accuracy on "
              f"all {n} held-out prompts of each seed (each seed draws its own problems); the same prompts per step for "
              "every G, so G times the samples. Training minutes: the sum of the steps' times (model loading aside)."]
    return group_verdict(rows), lines


# --- claim 3 --------------------------------------------------------------------------------------------

def kl_section(data: ClaimsData) -> tuple[Verdict, list[str]]:
    lines = ["| policy (against the starting model) | positions | exact KL | max abs(E[k1] - KL) | max abs(E[k3] - KL) | "
             "k3 min, sampled / vocabulary | k1 < 0 | Var k1 / Var k3, near | middle | far | sample mean k1 (se) | "
             "sample mean k3 (se) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in data.kl.items():
        var = [f"{v['k1_var']:.3g} / {v['k3_var']:.3g} ({v['positions']})" if v["positions"] else "-"
               for v in (m["variance"][b] for b in ("near", "middle", "far"))]
        lines.append(
            f"| {name} | {m['tokens']} | {m['exact_mean']:.5f} | {m['k1_bias_max']:.1e} | {m['k3_bias_max']:.1e} | "
            f"{m['k3_min']:.1e} / {m['k3_vocab_min']:.1e} | {m['k1_negative_share']:.1%} | {' | '.join(var)} | "
            f"{m['k1_mean']:.5f} ({m['k1_bias_se']:.5f}) | {m['k3_mean']:.5f} ({m['k3_bias_se']:.5f}) |"
        )
    c = data.cfg.claims
    lines += ["", f"{c.kl_samples} completions of each of {c.kl_prompts} held-out prompts sampled from the policy at T=1 "
              "(no top-p / top-k: exactly pi); nats per token. At each sampled position the expectation and variance of "
              "k1 = log(pi/ref) and k3 = ref/pi - log(ref/pi) - 1 under pi are sums over the whole vocabulary in float64 "
              "(`eval/kl.py`), so the bias columns are exact, not estimated; near / middle / far bin the positions by "
              "their exact KL (< 0.01, < 0.1, >= 0.1 nats), with the count of positions in brackets. The sample means "
              "are of the sampled tokens' k1 and k3 (se: of estimator - exact, paired per token): how far a few "
              "thousand draws land from the expectation."]
    return kl_verdict(data.kl), lines


# --- claim 5 --------------------------------------------------------------------------------------------

def hacking_section(data: ClaimsData, plots: Path) -> tuple[Verdict, list[str]]:
    numbers: dict[str, HackingNumbers] = {}
    changes: dict[str, GoldChange] = {}
    draws = data.cfg.train.prompts_per_step * data.cfg.rollout.num_generations
    for name, run_dir in data.hacking_runs.items():
        numbers[name] = analyse(read_metrics(Path(run_dir)), window=_window(data.cfg))
        changes[name] = gold_change(read_metrics(Path(run_dir)), draws)
    contrast = numbers.pop("rule reward (contrast)", None)
    verdict = hacking_verdict(numbers, contrast, changes)
    hack = data.cfg.claims
    caption = (f"{'reward-model' if hack.hacking_proxy is None else hack.hacking_proxy.name} runs: lr {hack.hacking_lr or data.cfg.optim.lr:g}, {hack.hacking_steps or data.cfg.train.num_steps} "
               f"steps; {setup_line(data.cfg, data.warm_start)}")
    _plot_hacking({**numbers, **({"rule reward (contrast)": contrast} if contrast else {})}, plots / "hacking.png", caption)
    rm = data.reward_model
    history = rm.get("history", [{}])
    acc = [h.get("eval/pair_accuracy") for h in history]
    trained = (
        f"Reward model: `AutoModelForSequenceClassification` from the starting model (a new one-output head), "
        f"trained with train-rm on {rm.get('pairs', 0)} pairs from {rm.get('prompts_with_both', 0)} of "
        f"{rm.get('prompts', 0)} training prompts whose {data.cfg.rollout.num_generations} samples of the starting "
        f"model held a right and a wrong answer by the rule reward ({_fmt(rm.get('right_share'))} of the samples "
        f"right); held-out pair accuracy {_fmt(acc[0])} before training, {_fmt(acc[-1])} after."
    )
    proxy = hack.hacking_proxy
    lines = [
        trained if proxy is None else f"Proxy: `{proxy.name}` (claims.hacking_proxy, docs/rewards.md), the rule reward as gold.",
        "",
        "| run | proxy, first -> last third | gold, first -> last third (95% interval of the change) | smoothed gold "
        "first -> peak (step) -> last | sqrt(KL) at the end | hacked |",
        "|---|---|---|---|---|---|",
    ]
    for name, n in {**numbers, **({"rule reward (contrast)": contrast} if contrast else {})}.items():
        c = changes[name]
        hacked = c.fell and c.proxy_last > c.proxy_first
        lines.append(
            f"| {name} | {c.proxy_first:.3f} -> {c.proxy_last:.3f} | {c.first:.3f} -> {c.last:.3f} ({c.diff:+.3f} "
            f"[{c.low:+.3f}, {c.high:+.3f}]) | {n.gold_start:.3f} -> {n.gold_peak:.3f} ({n.peak_step}) -> {n.gold_end:.3f} "
            f"| {n.sqrt_kl_end:.2f} | {'yes' if hacked else 'no'} |"
        )
    lines += ["", "![proxy and gold against sqrt(KL)](plots/hacking.png)", "",
              f"Runs on the {'reward model' if proxy is None else 'proxy'}: betas {list(hack.hacking_betas)}, lr {hack.hacking_lr or data.cfg.optim.lr:g}, "
              f"{hack.hacking_steps or data.cfg.train.num_steps} steps. Curves are {_window(data.cfg)}-step moving averages "
              "of the train-time scores of each step's samples; KL = train/kl_seq, nats per sequence."]
    return verdict, lines


def _window(cfg: Config) -> int:
    return max(1, min(9, (cfg.claims.hacking_steps or cfg.train.num_steps) // 4))


def _plot_hacking(runs: dict[str, HackingNumbers], path: Path, caption: str) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(2, 1, figsize=(6.5, 6), sharex=True)
    for i, (name, n) in enumerate(runs.items()):
        axes[0].plot(n.sqrt_kl, n.proxy, "o-", color=f"C{i}", label=name, markersize=3)
        axes[1].plot(n.sqrt_kl, n.gold, "o-", color=f"C{i}", label=name, markersize=3)
    axes[0].set_ylabel("proxy (training) reward")
    axes[1].set_ylabel("gold (rule) reward")
    axes[1].set_xlabel("sqrt(KL from the starting model), sqrt(nats per sequence)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    _save(fig, plt, path, caption)


# --- the report -----------------------------------------------------------------------------------------

def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, plt, path: Path, caption: str) -> None:
    save_figure(fig, plt, path, add_caption(fig, caption.replace("`", "")))


def write_claims_report(out: Path, data: ClaimsData) -> Path:
    """Write ``out/claims.md``, ``out/claims.json`` and ``out/plots/*.png``; returns the report's path."""
    plots = Path(out) / "plots"
    setup = setup_line(data.cfg, data.warm_start)
    sections = {
        i: (dataclasses.replace(verdict, setup=setup.replace("`", "")), body)
        for i, (verdict, body) in {
            1: critic_section(data, plots),
            2: group_section(data, plots),
            3: kl_section(data),
            4: pass_maj_section(data, plots),
            5: hacking_section(data, plots),
        }.items()
    }
    lines = [f"# grpolab claims: {data.cfg.log.run_name}", "", f"- **setup**: {setup}",
             f"- **time**: {sum(data.seconds.values()) / 60:.1f} min in all (stage: seconds, load average at its end); "
             + ", ".join(f"{k} {v:.0f} s ({data.loads.get(k, math.nan):.1f})" for k, v in data.seconds.items()), "",
             "| claim | verdict |", "|---|---|"]
    lines += [f"| {i}. {CLAIMS[i]} | {v.word} |" for i, (v, _) in sections.items()]
    for i, (verdict, body) in sections.items():
        lines += ["", f"## {i}. {CLAIMS[i]}", "", str(verdict), "", *body]
    path = Path(out) / "claims.md"
    jsonio.write_whole(path, "\n".join(lines) + "\n")
    summary = {
        "setup": setup,
        "verdicts": {str(i): dataclasses.asdict(v) for i, (v, _) in sections.items()},
        "warm_start": data.warm_start,
        "runs": {k: {kk: vv for kk, vv in v.items() if kk != "rows"} | {"kl_end": kl_end(v["rows"])}
                 for k, v in data.runs.items()},
        "kl": data.kl,
        "reward_model": {k: v for k, v in data.reward_model.items() if k != "history"},
        "seconds": data.seconds,
        "load_averages": data.loads,
    }
    jsonio.write_whole(Path(out) / "claims.json", jsonio.dumps(summary, indent=1) + "\n")
    return path
