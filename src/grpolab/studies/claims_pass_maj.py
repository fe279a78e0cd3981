"""``claims.md``, claim 4: Pass@K / Maj@K before and after GRPO, graded blind to format and by the task's reward.

DeepSeekMath's Fig. 7 (arXiv 2402.03300, Sec. 5.2.2) compares its Instruct model before and after RL on GSM8K
and MATH: Maj@K rises, Pass@K at large K does not. A model that fails mostly on format lets RL raise Pass@K at
every K by fixing the format alone, which says nothing about what the model can solve. So each sample is
graded twice (eval.blind_grader): the verdict's word comes from the format-blind grading, and the task
reward's curves stay in the report as the finding about format (studies/claims_verdicts.py, rule 4). With a
warm start (studies/claims_start.py) the original model's curves are shown beside.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from grpolab.eval.intervals import bootstrap_paired_diff
from grpolab.eval.report import plot_pass_maj
from grpolab.eval.results import ModelEval
from grpolab.studies.claims_data import ClaimsData, setup_line
from grpolab.studies.claims_verdicts import Verdict, pass_maj_verdict, sharpening_verdict


def blind_view(e: ModelEval) -> ModelEval:
    """``e`` with its format-blind curves in the place of the rewards' (to plot them)."""
    return dataclasses.replace(e, pass_at=e.blind_pass_at, maj_at=e.blind_maj_at)


def kind_verdict(kind: str, k: int, before: ModelEval, after: ModelEval, *, blind: bool, seed: int) -> Verdict:
    """pass_maj_verdict on the paired per-prompt values of one grading, at the largest K."""
    per = ("blind_per_prompt" if blind else "per_prompt")
    b, a = getattr(before, per), getattr(after, per)
    d_maj = bootstrap_paired_diff(b["maj"][k], a["maj"][k], seed=seed)
    d_pass = bootstrap_paired_diff(b["pass"][k], a["pass"][k], seed=seed)
    base = (before.blind_pass_at if blind else before.pass_at)[k]
    return pass_maj_verdict(f"{kind}, {'format-blind' if blind else 'task reward'}", k, base, d_maj, d_pass)


def pass_maj_section(data: ClaimsData, plots: Path) -> tuple[Verdict, list[str]]:
    cfg = data.cfg
    names = {"A": "the task's own problems", "B": f"harder problems, data.params {dict(cfg.claims.hard_params)}"}
    blind, strict = [], []
    lines = [warm_start_sentence(data.warm_start), ""] if data.warm_start else []
    for kind in ("A", "B"):
        if f"{kind}/base" not in data.evals:
            continue
        before, after = data.evals[f"{kind}/base"], data.evals[f"{kind}/GRPO"]
        models = [e for e in (data.evals.get(f"{kind}/original"), before, after) if e is not None]
        k = max(set(before.ks) & set(after.ks))
        blind.append(kind_verdict(f"{kind} ({names[kind]})", k, before, after, blind=True, seed=cfg.seed))
        strict.append(kind_verdict(f"{kind} ({names[kind]})", k, before, after, blind=False, seed=cfg.seed))
        caption = f"{kind}: {names[kind]}; {setup_line(cfg, data.warm_start)}".replace("`", "")
        plot_pass_maj([blind_view(e) for e in models], plots / f"pass_maj_{kind}.png", f"format-blind ({before.blind_grader}); {caption}")
        plot_pass_maj(models, plots / f"pass_maj_{kind}_reward.png", f"graded by the task's reward; {caption}")
        lines += kind_lines(kind, names[kind], models, sorted(set(before.ks) & set(after.ks)))
    kl = data.kl.get("GRPO (rule reward)", {}).get("exact_mean")
    return sharpening_verdict(blind, strict, data.warm_start or None, kl), lines


def kind_lines(kind: str, name: str, models: list[ModelEval], ks: list[int]) -> list[str]:
    """One kind's table (every model under both gradings), its format errors and its two figures."""
    first = models[-1]
    lines = [
        f"**{kind}: {name}**, {first.num_prompts} prompts x {first.num_samples} samples at T={first.temperature:g}; "
        "greedy accuracy (task reward / format-blind) " + ", ".join(
            f"{e.label} {_f(e.greedy_accuracy)} / {_f(e.greedy_blind_accuracy)}" for e in models),
        "",
        "| | " + " | ".join(f"K={x}" for x in ks) + " |",
        "|---|" + "---|" * len(ks),
    ]
    for grading, view in (("format-blind", blind_view), ("task reward", lambda e: e)):
        for metric in ("pass", "maj"):
            for e in models:
                curve = getattr(view(e), f"{metric}_at")
                lines.append(f"| {metric}@K {e.label}, {grading} | " + " | ".join(_f(curve.get(x)) for x in ks) + " |")
    lines += [
        "",
        "Format errors (wrong by the task's reward, right by the blind grader or no answer extracted), share of the "
        "samples / of the greedy replies: " + ", ".join(
            f"{e.label} {_f(e.format_error_share)} / {_f(e.greedy_format_error_share)}" for e in models),
        "",
        f"![Pass@K and Maj@K, {kind}, format-blind](plots/pass_maj_{kind}.png) "
        f"![Pass@K and Maj@K, {kind}, task reward](plots/pass_maj_{kind}_reward.png)",
        "",
    ]
    return lines


def warm_start_sentence(record: dict[str, Any]) -> str:
    errors = record.get("dev_format_errors")
    return (
        f"Warm start (`grpolab sft` on the answer format, the start of every experiment): {record['steps']} steps of "
        f"a budget of {record['budget']}, stopped at greedy dev format errors {_f(errors)} (target "
        f"{record['target_format_errors']:g}, {'reached' if record['reached'] else 'NOT reached'}) and greedy dev "
        f"accuracy {_f(record.get('dev_greedy_accuracy'))} on {record['dev_size']} training prompts set aside; "
        f"{record['seconds']:.0f} s. \"original\" is the model before it, \"base\" the warm-started model."
    )


def _f(value: float | None) -> str:
    return "n/a" if value is None or value != value else f"{value:.3f}"
