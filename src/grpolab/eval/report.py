"""A markdown report with PNG plots: training curves, Pass@K / Maj@K before and after RL, samples.

The summary sentence is computed from the numbers (``summary_sentence``), never written in advance:
it says what moved, by how much, and which reading the numbers support (DeepSeekMath Sec. 5.2.2,
arXiv 2402.03300: RL raises Maj@K but not Pass@K; Yue et al., arXiv 2504.13837: large-K Pass@K can fall).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpolab.eval.results import ModelEval
from grpolab.jsonio import write_whole

NOISE = 0.005
"""Changes smaller than this are reported as unchanged."""


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_pass_maj(evals: Sequence[ModelEval], path: str | Path, caption: str | None = None) -> Path:
    """Pass@K (solid) and Maj@K (dashed) against K on a log2 axis, one colour per model (DeepSeekMath Fig. 7);
    ``caption``: a line under the axes (what the figure was measured on)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for i, e in enumerate(evals):
        color = f"C{i}"
        ks = e.ks
        ax.plot(ks, [e.pass_at[k] for k in ks], "-o", color=color, label=f"{e.label} Pass@K")
        ax.plot(ks, [e.maj_at[k] for k in ks], "--s", color=color, label=f"{e.label} Maj@K")
    ax.set_xscale("log", base=2)
    ax.set_xticks(evals[0].ks, [str(k) for k in evals[0].ks]) if evals else None
    ax.set_xlabel("K (samples)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if evals:
        ax.set_title(f"Pass@K and Maj@K, {evals[0].num_prompts} held-out prompts, T={evals[0].temperature:g}")
    return save_figure(fig, plt, path, add_caption(fig, caption) if caption else None)


def add_caption(fig, text: str) -> tuple[float, float, float, float]:
    """``text`` in small type along the figure's bottom edge, wrapped to its width; returns the rectangle
    left for the axes (give it to save_figure)."""
    width = int(fig.get_figwidth() * 17)
    lines = textwrap.wrap(text, width)
    fig.text(0.01, 0.005, "\n".join(lines), fontsize=6, va="bottom", ha="left", color="0.3")
    return (0, min(0.3, 0.11 * (len(lines) + 0.5) / fig.get_figheight()), 1, 1)


def plot_training(rows: Sequence[Mapping[str, Any]], path: str | Path, window: int = 20) -> Path:
    """Train reward, zero-std group fraction and KL to the reference against the GRPO step.

    Each curve is drawn faint per step, with a ``window``-step moving average on top.
    """
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    steps = [r["step"] for r in rows]
    curves = (
        (left, "reward", "train reward", "C0"),
        (left, "frac_reward_zero_std", "zero-std groups", "C1"),
        (right, "kl", "KL to the reference (k3)", "C3"),
    )
    for ax, key, label, color in curves:
        values = [float("nan") if r.get(key) is None else float(r[key]) for r in rows]
        ax.plot(steps, values, color=color, alpha=0.3, linewidth=0.8)
        ax.plot(steps, _moving_average(values, window), color=color, label=label)
    left.set_ylim(0, 1.02)
    right.set_ylabel("nats / token")
    for ax in (left, right):
        ax.set_xlabel("GRPO step")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    return save_figure(fig, plt, path)


def _moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over up to ``window`` values, NaNs skipped."""
    out = []
    for i in range(len(values)):
        part = [v for v in values[max(0, i - window + 1) : i + 1] if v == v]
        out.append(sum(part) / len(part) if part else float("nan"))
    return out


def save_figure(fig, plt, path: str | Path, rect: tuple[float, float, float, float] | None = None) -> Path:
    """Lay out (within ``rect``: add_caption's room), write whole (a temporary file renamed) and close."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout(rect=rect or (0, 0, 1, 1))
    tmp = path.with_name(f".{path.name}.tmp")
    try:  # whole or the previous plot: written beside it, then renamed
        fig.savefig(tmp, dpi=110, format=path.suffix.lstrip(".") or "png")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
        plt.close(fig)
    return path


def _change(name: str, before: float, after: float) -> str:
    delta = after - before
    if abs(delta) < NOISE:
        return f"{name} stayed at {after:.3f} (from {before:.3f})"
    verb = "rose" if delta > 0 else "fell"
    return f"{name} {verb} from {before:.3f} to {after:.3f} ({delta:+.3f})"


def summary_sentence(before: ModelEval, after: ModelEval) -> str:
    """What the curves show, computed from the numbers of the model before and after RL."""
    k = max(set(before.ks) & set(after.ks))
    p1, pk = (before.pass_at[1], after.pass_at[1]), (before.pass_at[k], after.pass_at[k])
    mk = (before.maj_at[k], after.maj_at[k])
    parts = [_change("pass@1", *p1), _change(f"maj@{k}", *mk)]
    dpass, dmaj = pk[1] - pk[0], mk[1] - mk[0]
    parts.append(
        f"pass@{k} moved by {dpass:+.3f} ({pk[0]:.3f} to {pk[1]:.3f})"
        if abs(dpass) >= NOISE
        else f"pass@{k} stayed at {pk[1]:.3f} (from {pk[0]:.3f})"
    )
    text = "; ".join(parts) + ". "
    if p1[1] - p1[0] < NOISE:
        text += "RL did not improve pass@1 here."
    elif dmaj > 0 and abs(dpass) < dmaj / 2:
        text += (
            f"Maj@{k} gained {dmaj:+.3f} while Pass@{k} moved {dpass:+.3f}: RL made the right answer the "
            "likely one more often rather than making new answers reachable, as in DeepSeekMath Fig. 7."
        )
    elif dpass <= -0.02:
        text += (
            f"Pass@{k} fell: sampling narrowed and some problems the starting model could solve became "
            "unreachable (Yue et al., arXiv 2504.13837)."
        )
    else:
        text += f"Pass@{k} rose about as much as Maj@{k}: RL widened what the model solves, not only sharpened it."
    if pk[0] >= 0.98:
        text += f" Pass@{k} was already {pk[0]:.3f} before RL, so its flatness is partly a ceiling effect."
    return text


def pass_maj_table(evals: Sequence[ModelEval]) -> str:
    """A markdown table: one row per (model, metric), one column per K; with eval.blind_grader, its rows too."""
    ks = sorted(set.intersection(*(set(e.ks) for e in evals)))
    lines = ["| | " + " | ".join(f"K={k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for metric, attr in (("pass", "pass_at"), ("maj", "maj_at"), ("blind pass", "blind_pass_at"), ("blind maj", "blind_maj_at")):
        for e in evals:
            values = getattr(e, attr)
            if values:
                lines.append(f"| {e.label} {metric}@K | " + " | ".join(f"{values[k]:.3f}" for k in ks) + " |")
    return "\n".join(lines)


def summary_table(evals: Sequence[ModelEval]) -> str:
    lines = ["| model | greedy | pass@1 | format errors | mean length | eval time |", "|---|---|---|---|---|---|"]
    for e in evals:
        greedy = "-" if e.greedy_accuracy is None else f"{e.greedy_accuracy:.3f}"
        errors = "-" if e.format_error_share is None else f"{e.format_error_share:.3f}"
        lines.append(
            f"| {e.label} | {greedy} | {e.pass_at[1]:.3f} | {errors} | {e.mean_length:.2f} | {e.seconds:.1f} s |"
        )
    return "\n".join(lines)


def samples_section(evals: Sequence[ModelEval], max_prompts: int = 3) -> str:
    out = []
    for p in range(min(max_prompts, *(len(e.samples) for e in evals))):
        first = evals[0].samples[p]
        out.append(f"**Prompt** `{first['prompt']}`, reference `{first['answer']}`\n")
        for e in evals:
            s = e.samples[p]
            marks = " ".join(
                f"`{t}`{'✓' if ok else '✗'}" for t, ok in zip(s["sampled"], s["sampled_correct"], strict=True)
            )
            out.append(f"- {e.label}: greedy `{s['greedy']}`; samples {marks}")
        out.append("")
    return "\n".join(out)


def write_report(
    out_dir: str | Path,
    evals: Sequence[ModelEval],
    *,
    metrics_rows: Sequence[Mapping[str, Any]] = (),
    setup: Mapping[str, str] | None = None,
    title: str = "grpolab report",
) -> Path:
    """Write ``report.md`` and ``plots/*.png`` under out_dir; the first and last evals are before and after."""
    out = Path(out_dir)
    plot_pass_maj(evals, out / "plots" / "pass_maj.png")
    lines = [f"# {title}", ""]
    if len(evals) >= 2:
        lines += ["**What the curves show.** " + summary_sentence(evals[0], evals[-1]), ""]
    if setup:
        lines += ["## Setup", "", *(f"- {k}: {v}" for k, v in setup.items()), ""]
    lines += ["## Pass@K and Maj@K", "", "![Pass@K and Maj@K](plots/pass_maj.png)", ""]
    lines += [summary_table(evals), "", pass_maj_table(evals), ""]
    if metrics_rows:
        plot_training(metrics_rows, out / "plots" / "training.png")
        lines += ["## GRPO training curves", "", "![reward and KL](plots/training.png)", ""]
    lines += ["## Sample completions", "", samples_section(evals)]
    path = out / "report.md"
    write_whole(path, "\n".join(lines))  # whole or the previous one: never half a report
    return path
