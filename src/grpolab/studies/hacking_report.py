"""report.md and plots/hacking.png of ``grpolab hacking``: proxy and gold against sqrt(KL) and step, per run.

The numbers and each sentence come from hacking.analysis; this module only reads the run folders
(config.yaml, metrics.jsonl, samples.jsonl) and lays them out. The gold curve is the train-time gold
score of each step's samples (see studies/hacking.py), so the sample completions shown are the ones the
policy produced at that step, with the proxy and gold scores they received.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpolab.config import load_config
from grpolab.runtime.logging import read_metrics
from grpolab.studies.hacking_analysis import HackingNumbers, analyse, effective_beta, pick_samples, sentence


@dataclass
class RunSummary:
    name: str
    beta: float
    seed: int
    numbers: HackingNumbers
    samples: list[dict[str, Any]]


def load_run(name: str, run_dir: Path, *, window: int = 9, min_drop: float = 0.05) -> RunSummary:
    cfg = load_config(run_dir / "config.yaml")
    numbers = analyse(read_metrics(run_dir), window=window, min_drop=min_drop)
    path = run_dir / "samples.jsonl"
    samples = [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []
    return RunSummary(name, effective_beta(cfg), int(cfg.seed), numbers, samples)


def grid_sentence(runs: list[RunSummary]) -> str:
    """Per beta: in how many seeds the proxy was hacked, and the mean gold drop after the peak."""
    parts = []
    for beta in sorted({r.beta for r in runs}):
        group = [r for r in runs if r.beta == beta]
        hacked = sum(r.numbers.hacked for r in group)
        drop = sum(r.numbers.gold_drop for r in group) / len(group)
        kl = sum(r.numbers.sqrt_kl_end for r in group) / len(group)
        parts.append(
            f"beta = {beta:g}: hacked in {hacked} of {len(group)} runs (mean gold fall after its peak "
            f"{drop:.3f}, mean final sqrt(KL) {kl:.2f})"
        )
    return "; ".join(parts) + "."


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return "n/a" if math.isnan(v) else f"{v:.{digits}f}"
    return str(v)


def _runs_table(runs: list[RunSummary]) -> list[str]:
    head = (
        "| run | beta | seed | gold start | gold peak | peak step | sqrt(KL) at peak | turn step | gold end "
        "| proxy start -> end | sqrt(KL) end | hacked |"
    )
    lines = [head, "|" + "---|" * 12]
    for r in runs:
        n = r.numbers
        lines.append(
            f"| {r.name} | {r.beta:g} | {r.seed} | {_fmt(n.gold_start)} | {_fmt(n.gold_peak)} | {n.peak_step} "
            f"| {_fmt(n.sqrt_kl_at_peak, 2)} | {_fmt(n.turn_step)} | {_fmt(n.gold_end)} "
            f"| {_fmt(n.proxy_start)} -> {_fmt(n.proxy_end)} | {_fmt(n.sqrt_kl_end, 2)} | {'yes' if n.hacked else 'no'} |"
        )
    return lines


def _samples_table(rows: list[Mapping[str, Any]]) -> list[str]:
    if not rows:
        return ["(no samples logged)"]
    lines = ["| step | prompt | completion | proxy | gold |", "|---|---|---|---|---|"]
    for s in rows:
        text = json.dumps(s["completion"])[1:-1].replace("|", "\\|")
        lines.append(
            f"| {s['step']} | `{s['prompt']}` | `{text}` | {_fmt(s['reward'])} | {_fmt(s['gold'])} |"
        )
    return lines


def _sample_sections(runs: list[RunSummary]) -> list[str]:
    out = []
    for beta in sorted({r.beta for r in runs}):
        r = next(x for x in runs if x.beta == beta)
        n = r.numbers
        out += [f"### {r.name}: at the gold peak (step {n.peak_step})", ""]
        out += [*_samples_table(pick_samples(r.samples, n.peak_step)), ""]
        out += [f"### {r.name}: at the end (step {n.steps[-1]}), highest proxy first", ""]
        out += [*_samples_table(pick_samples(r.samples, n.steps[-1], hacks_first=True)), ""]
    return out


def write_report(
    out: Path,
    run_dirs: Mapping[str, Path],
    *,
    title: str | None = None,
    setup: Mapping[str, Any] | None = None,
    window: int = 9,
    min_drop: float = 0.05,
) -> Path:
    """Write ``out/report.md`` and ``out/plots/hacking.png``; returns the report's path."""
    runs = [load_run(name, Path(d), window=window, min_drop=min_drop) for name, d in run_dirs.items()]
    out = Path(out)
    plot = plot_runs(runs, out / "plots" / "hacking.png")
    lines = [f"# {title or 'grpolab hacking: proxy vs gold reward (Gao et al., arXiv 2210.10760)'}", ""]
    if setup:
        lines += [f"- **{k}**: {v}" for k, v in setup.items()] + [""]
    lines += [
        "## Reading",
        "",
        grid_sentence(runs),
        "",
        *[f"- {r.name}: {sentence(r.numbers)}" for r in runs],
        "",
        f"Curves are {window}-step centred moving averages of the train-time scores of each step's samples; "
        f"'hacked' = the gold fell more than {min_drop:g} after its peak while the proxy did not fall by as much. "
        "KL: mean over the step's samples of sum_t log pi_old - log pi_ref, nats per sequence.",
        "",
        "## Runs",
        "",
        *_runs_table(runs),
        "",
        f"![proxy and gold against sqrt(KL) and step]({plot.relative_to(out)})",
        "",
        "## Samples (train-time, with the scores they received)",
        "",
        *_sample_sections(runs),
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def plot_runs(runs: list[RunSummary], path: Path) -> Path:
    """2 x 2: proxy (top) and gold (bottom) against sqrt(KL) (left) and step (right); colour = beta."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    betas = sorted({r.beta for r in runs})
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharey="row")
    styles = ["-", "--", ":", "-."]
    for r in runs:
        n = r.numbers
        color = f"C{betas.index(r.beta)}"
        style = styles[sorted({x.seed for x in runs}).index(r.seed) % len(styles)]
        label = f"beta {r.beta:g}, seed {r.seed}"
        for row, ys in ((0, n.proxy), (1, n.gold)):
            axes[row][0].plot(n.sqrt_kl, ys, style, color=color, label=label)
            axes[row][1].plot(n.steps, ys, style, color=color, label=label)
            axes[row][1].axvline(n.peak_step, color=color, alpha=0.15) if row == 1 else None
    for row, name in ((0, "proxy reward"), (1, "gold reward")):
        axes[row][0].set_ylabel(name)
        for ax in axes[row]:
            ax.grid(alpha=0.3)
    axes[1][0].set_xlabel("sqrt(KL from the reference), sqrt(nats)")
    axes[1][1].set_xlabel("step")
    axes[0][1].legend(fontsize=7)
    fig.suptitle("Proxy vs gold reward (Gao et al., arXiv 2210.10760)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
