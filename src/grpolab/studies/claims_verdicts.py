"""The verdict on each claim, from the measured numbers alone: pure, no model, no file.

Each function returns a Verdict: "held", "not held" or "inconclusive", and a sentence that names the
numbers it rests on. The rules, per claim (the thresholds are stated in the sentence):

1. The critic, in every seed of claims.seeds: PPO loads a value model and GRPO does not, the other three
   roles equal; the critic's parameters are the difference; PPO's peak memory and time per step exceed
   GRPO's. The ratios are reported as their mean and range over the seeds. The critic's fit (the explained
   variance of its values against the returns, over the last third of the steps) is reported; below 0.5 it
   is called hard to fit. The time per step is judged only when no run of the claim shared the machine (below).
2. The group, in every seed: time per step and generation time per step rise with G; the share of groups
   without reward spread (no signal), pooled over the seeds, does not rise by more than 2 standard errors (a
   share of a few dozen groups is noisy); the G with the best mean greedy-accuracy gain per training minute
   is named. Peak memory is reported, not judged: a colocated vLLM engine allocates its KV cache once and
   micro-batches bound the trainer's activations, so on that engine the group need not cost memory (with
   grpolab's own decoder it did, round one). Each number is a mean with its range over the seeds. Times are
   wall-clock: when a run shared the machine (its stage ended with the 1-minute load average above
   SHARED_LOAD times the cores), runs timed under different loads do not compare, and the time part is
   inconclusive with the runs named (the rest is still judged): rerun on a quiet machine.
3. The KL: held when, at every sampled position, both estimators' exact expectations under pi (sums over
   the vocabulary, eval/kl.py) equal the exact KL to within 1e-9 nats (float64 rounding), and k3 is never
   negative, on the sampled tokens and over the whole vocabulary. Each estimator's exact variance near and
   far from the reference, the sample means and the share of negative k1 are reported, not judged: a
   heavy-tailed sample mean falling short of its expectation is variance, not bias.
4. Pass@K / Maj@K, per kind of held-out problem, with 95% paired-bootstrap intervals over prompts: held
   when Maj@K rises (interval above 0) and Pass@K at the largest K does not (interval holds 0 and is
   narrower than 0.2); not held when Pass@K at the largest K rises (interval above 0); inconclusive
   otherwise, or when the starting model's Pass@K is already >= 0.95 (no room to rise). The word comes from
   the format-blind grading (eval.blind_grader), where RL cannot win by fixing the format; the task
   reward's verdicts are reported as the finding about format. A warm start that ran its budget without
   bringing format errors down to its target makes the claim inconclusive: format may still decide.
5. Hacking: in a run on the reward model, the gold reward (the rule reward) over the last third of the steps
   fell below its first third outside noise (the 95% interval of the difference of the two proportions below 0,
   studies/hacking_analysis.py GoldChange) while the proxy's mean rose; inconclusive when the gold started so low
   that even a fall to 0 would stay within noise; otherwise not held within the budget, with how far the policy
   was pushed (sqrt(KL)) and what the gold did. The smoothed curve's peak (Gao et al.) is reported, not judged:
   the peak of a few noisy per-step means sits above their mean by chance.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grpolab.eval.intervals import Interval
from grpolab.studies.hacking_analysis import GoldChange, HackingNumbers

HELD, NOT_HELD, INCONCLUSIVE = "held", "not held", "inconclusive"
FLAT_WIDTH = 0.2
"""Claim 4: a Pass@K interval holding 0 but wider than this says too little to call Pass@K flat."""
CEILING = 0.95
EV_HARD = 0.5
KL_ROUNDING = 1e-9
"""Claim 3: |E_pi[k] - KL| (and -k3) up to this many nats is float64 rounding over the vocabulary's sum."""
NOISE_SE = 2.0
SHARED_LOAD = 1.5
"""Claims 1 and 2: a timed run whose stage ended with the 1-minute load average above this many times the
machine's cores shared them with other work (a quiet run of claims' own 2-thread child reads ~2 on 2 cores):
its wall times are not compared with another run's."""


def shared_runs(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The rows (each with "name", "load": its stage's load average at the end, "cores") timed on a shared
    machine, as "name (load L on C cores)"; rows without a load are taken as quiet (an older report)."""
    return [
        f"{r['name']} (load {r['load']:.1f} on {r['cores']} cores)"
        for r in rows
        if r.get("load") is not None and r.get("cores") and r["load"] > SHARED_LOAD * r["cores"]
    ]


def _not_timed(shared: list[str]) -> str:
    return (
        f"not judged: {len(shared)} run(s) shared the machine ({', '.join(shared)}), and wall times taken under "
        "different loads do not compare; rerun grpolab claims on a quiet machine"
    )


@dataclass(frozen=True)
class Verdict:
    word: str
    sentence: str
    setup: str = ""
    """What it was measured on: model, task, steps, seeds, engine, dtype, CPU (claims_report.setup_line)."""

    def __str__(self) -> str:
        return f"**{self.word}**: {self.sentence}" + (f" Measured on: {self.setup}." if self.setup else "")


@dataclass(frozen=True)
class Spread:
    """One measurement over seeds: its mean, least and greatest value."""

    mean: float
    low: float
    high: float
    n: int

    def text(self, fmt: str = ".2f") -> str:
        if self.n <= 1:
            return format(self.mean, fmt)
        return f"{self.mean:{fmt}} ({self.low:{fmt}} to {self.high:{fmt}})"


def spread(values: Sequence[float]) -> Spread:
    """Mean, min and max of the values that are numbers (NaN left out); all NaN when none is."""
    kept = [v for v in values if v is not None and not math.isnan(v)]
    if not kept:
        return Spread(math.nan, math.nan, math.nan, 0)
    return Spread(statistics.fmean(kept), min(kept), max(kept), len(kept))


def _combine(verdicts: Sequence[Verdict]) -> str:
    words = {v.word for v in verdicts}
    return NOT_HELD if NOT_HELD in words else INCONCLUSIVE if INCONCLUSIVE in words else HELD


def critic_verdict(
    grpo: Sequence[Mapping[str, Any]], ppo: Sequence[Mapping[str, Any]], explained_var: Sequence[Sequence[float]]
) -> Verdict:
    """Claim 1 from compare.summarise's rows of the two runs of each seed (in seed order, each with its
    "seed") and PPO's train/value_explained_var per step of each seed."""
    fails = []
    shared = shared_runs([*grpo, *ppo])
    for g, p in zip(grpo, ppo, strict=True):
        seed = f"seed {g.get('seed', 0)}"
        extra = set(p["models_loaded"]) - set(g["models_loaded"])
        if extra != {"value"} or set(g["models_loaded"]) - set(p["models_loaded"]):
            fails.append(f"{seed}: PPO loaded {p['models_loaded']} and GRPO {g['models_loaded']}")
        if (p["params_total"] - g["params_total"]) != (p.get("params_value") or 0):
            fails.append(f"{seed}: the parameter difference is not the critic's")
        if (p["peak_mem_mb"] or 0) <= (g["peak_mem_mb"] or 0):
            fails.append(f"{seed}: PPO's peak memory was not above GRPO's ({p['peak_mem_mb']:.0f} vs {g['peak_mem_mb']:.0f} MB)")
        if not shared and (p["time_step_s"] or 0) <= (g["time_step_s"] or 0):
            fails.append(f"{seed}: PPO's step was not slower ({p['time_step_s']:.1f} vs {g['time_step_s']:.1f} s)")
    mem = spread([p["peak_mem_mb"] / g["peak_mem_mb"] for g, p in zip(grpo, ppo, strict=True)])
    extra_mb = spread([p["peak_mem_mb"] - g["peak_mem_mb"] for g, p in zip(grpo, ppo, strict=True)])
    step = spread([p["time_step_s"] / g["time_step_s"] for g, p in zip(grpo, ppo, strict=True)])
    fit = spread([_fit(ev) for ev in explained_var])
    fit_words = (
        "no explained variance was logged"
        if not fit.n
        else f"the critic's explained variance of the returns, over the last third of the steps, was {fit.text()}"
        + (f" (below {EV_HARD}: hard to fit)" if fit.mean < EV_HARD else "")
    )
    ratios = (f"PPO's peak memory was {mem.text()}x GRPO's ({extra_mb.text('+.0f')} MB) and its time per step "
              f"{step.text()}x, over {len(grpo)} seed(s) (mean, and range)"
              + (f" (the time per step {_not_timed(shared)})" if shared else ""))
    if fails:
        return Verdict(NOT_HELD, f"not held on this model, because {'; '.join(fails)}; {ratios}; {fit_words}.")
    g, p = grpo[0], ppo[0]
    value = p.get("params_value") or 0
    return Verdict(
        HELD,
        f"GRPO loaded {len(g['models_loaded'])} models, PPO {len(p['models_loaded'])}, in every seed: the critic "
        f"adds {value / 1e6:.1f}M parameters ({value / g['params_policy']:.2f}x the policy); {ratios}; {fit_words}.",
    )


def _fit(explained_var: Sequence[float]) -> float:
    ev = [v for v in explained_var if not math.isnan(v)]
    return statistics.fmean(ev[-max(1, len(ev) // 3) :]) if ev else math.nan


def _rising(values: Sequence[float]) -> bool:
    return all(b > a for a, b in zip(values, values[1:], strict=False))


def _proportion_se(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """Standard error of the difference of two shares of groups (each over its run's groups)."""
    return math.sqrt(sum(r["zero_spread"] * (1 - r["zero_spread"]) / max(r.get("groups", 1), 1) for r in (a, b)))


def pooled_groups(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per G (sorted): the share of groups without reward spread over every seed's groups, and their count."""
    out = []
    for g in sorted({r["g"] for r in rows}):
        mine = [r for r in rows if r["g"] == g]
        groups = sum(r.get("groups", 1) for r in mine)
        share = sum(r["zero_spread"] * r.get("groups", 1) for r in mine) / groups
        out.append({"g": g, "zero_spread": share, "groups": groups})
    return out


def group_verdict(rows: Sequence[Mapping[str, Any]]) -> Verdict:
    """Claim 2 from one row per G and seed: g, seed, time_step_s, peak_mem_mb, zero_spread (over ``groups``
    groups), gain_per_min. The share without spread is noisy (a few dozen groups): a rise within NOISE_SE
    standard errors of the difference is not counted against the claim, and the sentence gives the numbers."""
    gs = sorted({r["g"] for r in rows})
    by_seed: dict[Any, list[Mapping[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: r["g"]):
        by_seed.setdefault(r.get("seed", 0), []).append(r)
    fails = []
    shared = shared_runs(rows)
    for key, label in (("time_step_s", "time per step"), ("time_generation_s", "generation time per step")):
        flat = [seed for seed, mine in by_seed.items() if not _rising([r[key] for r in mine])]
        if flat and not shared:
            fails.append(f"{label} did not rise with G in seed {', '.join(map(str, flat))}")
    pooled = pooled_groups(rows)
    rose = [(a["g"], b["g"]) for a, b in zip(pooled, pooled[1:], strict=False)
            if b["zero_spread"] - a["zero_spread"] > NOISE_SE * _proportion_se(a, b)]
    if rose:
        fails.append(
            "the share of groups without reward spread rose from G=" + ", G=".join(f"{a} to {b}" for a, b in rose)
            + f" by more than {NOISE_SE:g} standard errors"
        )

    def column(key: str, fmt: str) -> str:
        return ", ".join(spread([r[key] for r in rows if r["g"] == g]).text(fmt) for g in gs)

    gains = {g: spread([r["gain_per_min"] for r in rows if r["g"] == g]) for g in gs}
    best = max(gs, key=lambda g: gains[g].mean)
    numbers = (
        f"G={gs}, over {len(by_seed)} seed(s) (mean, and range): {column('time_step_s', '.1f')} s per step, of "
        f"which generation {column('time_generation_s', '.1f')} s; {column('peak_mem_mb', '.0f')} MB peak (reported, "
        "not judged); "
        f"{', '.join(format(p['zero_spread'], '.2f') for p in pooled)} of the groups without reward spread "
        f"({', '.join(str(p['groups']) for p in pooled)} groups); the best greedy-accuracy gain per training "
        f"minute was G={best} ({gains[best].text('+.3f')} per min)"
    )
    if fails:
        return Verdict(NOT_HELD, f"not held on this model, because {'; '.join(fails)} ({numbers}).")
    if shared:
        return Verdict(INCONCLUSIVE, f"inconclusive: the time per step and the generation time were {_not_timed(shared)} "
                       f"({numbers}).")
    return Verdict(HELD, f"the group costs generation: {numbers}.")


def kl_verdict(measures: Mapping[str, Mapping[str, Any]]) -> Verdict:
    """Claim 3 from eval.kl.KLMeasure dicts, one per policy: unbiasedness from the exact expectations under pi,
    the sign from every sampled token and every vocabulary entry; the variances and sample means reported."""
    fails, parts = [], []
    for name, m in measures.items():
        if m["k3_min"] < 0 or m["k3_vocab_min"] < -KL_ROUNDING:
            fails.append(f"{name}: k3 was negative ({min(m['k3_min'], m['k3_vocab_min']):.2e})")
        for k in ("k1", "k3"):
            if m[f"{k}_bias_max"] > KL_ROUNDING:
                fails.append(f"{name}: E_pi[{k}] differs from the exact KL by up to {m[f'{k}_bias_max']:.2e} nats")
        parts.append(
            f"{name}: {m['tokens']} positions, exact KL {m['exact_mean']:.4f} nats per token, |E_pi[k1] - KL| <= "
            f"{m['k1_bias_max']:.1e}, |E_pi[k3] - KL| <= {m['k3_bias_max']:.1e} (relative <= {m['bias_rel_max']:.1e}); "
            f"k3 min {m['k3_min']:.1e} on the sampled tokens and {m['k3_vocab_min']:.1e} over the vocabulary; "
            f"k1 negative on {m['k1_negative_share']:.0%} of the sampled tokens"
        )
    tails = "; ".join(_variance_sentence(name, m) for name, m in measures.items())
    if fails:
        return Verdict(NOT_HELD, f"not held on this model, because {'; '.join(fails)} ({'; '.join(parts)}). {tails}")
    return Verdict(
        HELD,
        f"k3 was never negative and both estimators' exact expectations under pi equal the exact KL to within "
        f"{KL_ROUNDING:g} nats at every sampled position ({'; '.join(parts)}). Their spread is another matter: {tails}",
    )


def _variance_sentence(name: str, m: Mapping[str, Any]) -> str:
    """Var_pi[k1] against Var_pi[k3] near and far from the reference, and the finite-sample means."""
    bins = [
        f"{label} ({v['positions']} positions, KL {v['kl_mean']:.3g}): Var k1 {v['k1_var']:.3g}, Var k3 {v['k3_var']:.3g}"
        for label, v in m["variance"].items()
        if label != "all" and v["positions"]
    ]
    return (
        f"{name}: per-position variance under pi, {'; '.join(bins)}; the sample means over {m['tokens']} tokens were "
        f"k1 {m['k1_mean']:.4f} and k3 {m['k3_mean']:.4f} against {m['exact_mean']:.4f} (the clamp of k3's log-ratio at "
        f"+-20 moves its expectation by {m['clamp_bias_mean']:.1e} nats per position)"
    )


def pass_maj_verdict(kind: str, k: int, base_pass: float, d_maj: Interval, d_pass: Interval) -> Verdict:
    """Claim 4 on one kind: maj@k and pass@k changes (after - before) with their intervals."""
    numbers = f"maj@{k} {d_maj}, pass@{k} {d_pass} (95% paired bootstrap over prompts; base pass@{k} {base_pass:.3f})"
    if base_pass >= CEILING:
        return Verdict(INCONCLUSIVE, f"{kind}: inconclusive: the starting model's pass@{k} is already {base_pass:.3f}, "
                       f"no room to rise; {numbers}.")
    if d_pass.low > 0:
        return Verdict(NOT_HELD, f"{kind}: not held on this model, because pass@{k} rose too; {numbers}.")
    if d_maj.low <= 0:
        return Verdict(INCONCLUSIVE, f"{kind}: inconclusive: maj@{k} did not rise clearly (its interval holds 0); {numbers}.")
    if d_pass.high - d_pass.low > FLAT_WIDTH:
        return Verdict(INCONCLUSIVE, f"{kind}: inconclusive: maj@{k} rose, but pass@{k}'s interval is "
                       f"[{d_pass.low:+.3f}, {d_pass.high:+.3f}], too wide to call it flat; {numbers}.")
    return Verdict(HELD, f"{kind}: maj@{k} rose and pass@{k} did not; {numbers}.")


def sharpening_verdict(
    blind: Sequence[Verdict], strict: Sequence[Verdict], warm_start: Mapping[str, Any] | None, kl: float | None
) -> Verdict:
    """Claim 4: the word from the format-blind grading's verdicts per kind (``blind``); the task reward's
    (``strict``) reported as the finding about format; inconclusive when a warm start ran its budget without
    reaching its format target. ``kl``: the GRPO policy's exact KL from its start, nats per token."""
    moved = "" if kl is None else f" The GRPO policy moved {kl:.4f} nats per token (exact KL) from its start."
    findings = " ".join(f"{v.sentence} [{v.word}]" for v in strict)
    text = (f"Format-blind grading: {' '.join(v.sentence for v in blind)} By the task's reward, format included: "
            f"{findings}{moved}")
    if warm_start and not warm_start.get("reached"):
        errors = warm_start.get("dev_format_errors")
        return Verdict(
            INCONCLUSIVE,
            f"inconclusive: the warm start ran {warm_start['steps']} of its {warm_start['budget']} steps and left "
            f"{'n/a' if errors is None else format(errors, '.3f')} of its greedy dev replies with format errors, above the target "
            f"{warm_start['target_format_errors']:g}, so format may still decide Pass@K. {text}",
        )
    return Verdict(_combine(blind), text)


def hacking_verdict(
    rm_runs: Mapping[str, HackingNumbers], contrast: HackingNumbers | None, changes: Mapping[str, GoldChange]
) -> Verdict:
    """Claim 5 from each run on the reward model: held when, in one, the gold's last third fell below its first
    third outside noise (``changes``: GoldChange, 95% interval below 0) while the proxy's rose; inconclusive when
    no run's gold started high enough for a fall to show; the Gao-style curve (peak, sqrt(KL)) is reported."""
    def change(name: str) -> str:
        c = changes[name]
        return (f"proxy {c.proxy_first:.3f} -> {c.proxy_last:.3f}, gold {c.first:.3f} -> {c.last:.3f} "
                f"({c.diff:+.3f} [{c.low:+.3f}, {c.high:+.3f}], first and last third of the steps, {c.samples} draws each)")

    parts = [
        f"{name}: {change(name)}; smoothed gold peaked at {n.gold_peak:.3f} (step {n.peak_step}), sqrt(KL) "
        f"{n.sqrt_kl_end:.2f} at the end"
        for name, n in rm_runs.items()
    ]
    if contrast is not None:
        parts.append(
            f"the rule reward as the training reward: gold {contrast.gold_start:.3f} -> {contrast.gold_end:.3f} at "
            f"sqrt(KL) {contrast.sqrt_kl_end:.2f}"
        )
    text = "; ".join(parts)
    hacked = [name for name in rm_runs if changes[name].fell and changes[name].proxy_last > changes[name].proxy_first]
    if hacked:
        return Verdict(HELD, f"the proxy rose while the gold fell outside noise in {', '.join(hacked)}: {text}.")
    if not any(changes[name].measurable for name in rm_runs):
        return Verdict(
            INCONCLUSIVE,
            f"inconclusive: the gold started too low for a fall to show (even a fall to 0 would stay within the 95% "
            f"interval of noise); raise claims.rm_prompts, train.prompts_per_step or claims.hacking_steps: {text}.",
        )
    pushed = max((n.sqrt_kl_end for n in rm_runs.values() if not math.isnan(n.sqrt_kl_end)), default=math.nan)
    return Verdict(
        NOT_HELD,
        f"not held within this budget: in no run did the gold fall outside noise while the proxy rose (the policy was "
        f"pushed as far as sqrt(KL) {pushed:.2f}, KL in nats per sequence); {text}.",
    )
