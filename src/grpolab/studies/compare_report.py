"""The comparison report: report.md (models, parameters, peak memory, time per step, reward) and plots/*.png."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grpolab.config import Config


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return lines + [""]


def _models_table(summary) -> list[str]:
    header = ["algo", "models loaded", "policy", "reference", "reward model", "value", "total"]
    rows = [
        [
            s["algo"],
            ", ".join(s["models_loaded"]),
            s["params_policy"],
            s["params_reference"],
            s["params_reward"] if s["params_reward"] is not None else "rules",
            s["params_value"],
            s["params_total"],
        ]
        for s in summary
    ]
    return _table(header, rows)


def _settings_table(summary) -> list[str]:
    keys = list(summary[0]["settings"]) if summary else []
    return _table(["algo", *keys], [[s["algo"], *(s["settings"][k] for k in keys)] for s in summary])


def _memory_table(summary) -> list[str]:
    header = ["algo", "device", "peak memory (MB)", "before models (MB)", "peak - before (MB)"]
    rows = []
    for s in summary:
        peak, base = s["peak_mem_mb"], s["baseline_mem_mb"]
        rows.append([s["algo"], s["device"], peak, base, None if None in (peak, base) else peak - base])
    return _table(header, rows)


def _time_table(summary) -> list[str]:
    header = [
        "algo",
        "generation",
        "scoring",
        "reference (+ values, old log-probs)",
        "of which value forward",
        "policy update",
        "value update",
        "step",
        "run wall (s)",
    ]
    keys = [
        "time_generation_s",
        "time_scoring_s",
        "time_reference_s",
        "time_value_forward_s",
        "time_policy_update_s",
        "time_value_update_s",
        "time_step_s",
        "wall_s",
    ]
    return _table(header, [[s["algo"], *(s[k] for k in keys)] for s in summary])


def _reward_table(summary) -> list[str]:
    header = ["algo", "steps", "samples generated", "reward at step 1", "reward, last 20% of steps"]
    keys = ["steps", "samples", "reward_first", "reward_last"]
    return _table(header, [[s["algo"], *(s[k] for k in keys)] for s in summary])


def _reading(summary) -> list[str]:
    """What the numbers say about the critic, for each algorithm with a value model against one without."""
    base = next((s for s in summary if s["params_value"] is None), None)
    lines = []
    for s in summary:
        if s["params_value"] is None or base is None:
            continue
        ratio = s["params_value"] / s["params_policy"]
        lines.append(
            f"* {s['algo']} loads {len(s['models_loaded'])} models to {base['algo']}'s {len(base['models_loaded'])}: "
            f"the value model adds {s['params_value']:,} parameters ({ratio:.2f}x the policy), "
            f"{s['params_total'] / max(base['params_total'], 1):.2f}x {base['algo']}'s total."
        )
        if s["peak_mem_mb"] is not None and base["peak_mem_mb"] is not None:
            lines.append(
                f"* Peak memory: {s['peak_mem_mb']:.0f} MB against {base['peak_mem_mb']:.0f} MB "
                f"(+{s['peak_mem_mb'] - base['peak_mem_mb']:.0f} MB)."
            )
        critic = (s["time_value_forward_s"] or 0.0) + (s["time_value_update_s"] or 0.0)
        if s["time_step_s"] and base["time_step_s"]:
            lines.append(
                f"* Time per step: {s['time_step_s']:.3g} s against {base['time_step_s']:.3g} s; the critic "
                f"(value forward at rollout + value update) takes {critic:.3g} s, {critic / s['time_step_s']:.0%} "
                f"of {s['algo']}'s step."
            )
    return [*lines, ""] if lines else []


def _data_desc(cfg: Config) -> str:
    d = cfg.data
    where = d.path or d.name or ", ".join(f"{k}={v}" for k, v in d.params.items())
    return f"`{d.source}` ({where})" if where else f"`{d.source}`"


def write_report(out: Path, cfg: Config, runs, summary: list[dict[str, Any]]) -> Path:
    """Write out/report.md and out/plots/*.png; return the report's path."""
    plots = write_plots(out / "plots", runs)
    lines = [
        "# grpolab compare",
        "",
        f"Model `{cfg.model.name_or_path}`, data {_data_desc(cfg)}, "
        f"seed {cfg.seed}, {cfg.train.num_steps} steps of {cfg.train.prompts_per_step} prompts x "
        f"{cfg.rollout.num_generations} completions ({cfg.completions_per_step} samples per step), "
        f"max {cfg.rollout.max_completion_length} completion tokens.",
        "Each algorithm ran in its own process, one after another. Peak memory is process RSS on a CPU and "
        "max allocated memory on a GPU; 'before models' is the same measure before any model was loaded.",
        "Times are seconds per step, means over steps 2 onwards.",
        "",
        "## What each algorithm ran",
        "",
        "Each algorithm's resolved settings, read from the config.yaml its run saved: its preset's values "
        "wherever the user left a field unset (`grpolab config algo.name=NAME` prints the same).",
        "",
        *_settings_table(summary),
        "## Models and parameters",
        "",
        *_models_table(summary),
        "## Peak memory",
        "",
        *_memory_table(summary),
        "## Time per step (s)",
        "",
        *_time_table(summary),
        "## Reward",
        "",
        *_reward_table(summary),
        "## What the numbers say",
        "",
        *_reading(summary),
        "## Plots",
        "",
        *[f"![{p.stem}](plots/{p.name})" for p in plots],
        "",
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def _series(run, key: str, x_key: str = "step") -> tuple[list[float], list[float]]:
    pts = [(r[x_key], r[key]) for r in run.metrics if r.get(key) is not None and r.get(x_key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def write_plots(folder: Path, runs) -> list[Path]:
    """Reward against steps and against samples generated, time per step by phase, eval curves if any."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for x_key, name, label in (
        ("step", "reward_vs_step", "step"),
        ("sys/samples_seen", "reward_vs_samples", "samples generated"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        for run in runs:
            ax.plot(*_series(run, "reward", x_key), label=run.algo)
        ax.set(xlabel=label, ylabel="reward", title=f"reward against {label}")
        ax.legend()
        written.append(_save(fig, folder / f"{name}.png"))
    written.append(_time_plot(plt, runs, folder / "time_per_step.png"))
    eval_keys = sorted({k for run in runs for r in run.metrics for k in r if k.startswith("eval/")})
    for key in eval_keys:
        fig, ax = plt.subplots(figsize=(6, 4))
        for run in runs:
            ax.plot(*_series(run, key), marker="o", label=run.algo)
        ax.set(xlabel="step", ylabel=key, title=key)
        ax.legend()
        written.append(_save(fig, folder / f"{key.replace('/', '_').replace('@', 'at')}.png"))
    return written


_PHASES = (
    ("sys/time_generation_s", "generation"),
    ("sys/time_scoring_s", "scoring"),
    ("sys/time_reference_s", "reference (+ values)"),
    ("sys/time_training_s", "training (policy + value)"),
)


def _time_plot(plt, runs, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    bottoms = [0.0] * len(runs)
    for key, label in _PHASES:
        heights = []
        for run in runs:
            vals = [r[key] for r in (run.metrics[1:] or run.metrics) if r.get(key) is not None]
            heights.append(sum(vals) / len(vals) if vals else 0.0)
        ax.bar([r.algo for r in runs], heights, bottom=bottoms, label=label)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set(ylabel="seconds per step", title="time per step by phase")
    ax.legend()
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
