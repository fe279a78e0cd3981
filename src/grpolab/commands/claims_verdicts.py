"""The verdict on each claim, from the measured numbers alone: pure, no model, no file.

Each function returns a Verdict: "held", "not held" or "inconclusive", and a sentence that names the
numbers it rests on. The rules, per claim (the thresholds are stated in the sentence):

1. The critic: PPO loads a value model and GRPO does not, the other three roles equal; the critic's
   parameters are the difference; PPO's peak memory and time per step exceed GRPO's. Its fit (the
   explained variance of its values against the returns, over the last third of the steps) is reported;
   below 0.5 it is called hard to fit.
2. The group: time per step and peak memory rise with G, and the share of groups without reward spread
   (no signal) does not rise by more than 2 standard errors (a share of a few dozen groups is noisy); the G
   with the best greedy-accuracy gain per training minute is named.
3. The KL: held when, at every sampled position, both estimators' exact expectations under pi (sums over
   the vocabulary, eval/kl.py) equal the exact KL to within 1e-9 nats (float64 rounding), and k3 is never
   negative, on the sampled tokens and over the whole vocabulary. Each estimator's exact variance near and
   far from the reference, the sample means and the share of negative k1 are reported, not judged: a
   heavy-tailed sample mean falling short of its expectation is variance, not bias.
4. Pass@K / Maj@K, per kind of held-out problem, with 95% paired-bootstrap intervals over prompts: held
   when Maj@K rises (interval above 0) and Pass@K at the largest K does not (interval holds 0 and is
   narrower than 0.2); not held when Pass@K at the largest K rises (interval above 0); inconclusive
   otherwise, or when the starting model's Pass@K is already >= 0.95 (no room to rise).
5. Hacking: the gold reward fell more than min_drop after its peak while the proxy did not fall
   (commands/hacking_analysis.py) in a run on the reward model; otherwise not held within the budget,
   with how far the policy was pushed (sqrt(KL)) and what the gold did.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grpolab.commands.hacking_analysis import HackingNumbers
from grpolab.eval.intervals import Interval

HELD, NOT_HELD, INCONCLUSIVE = "held", "not held", "inconclusive"
FLAT_WIDTH = 0.2
"""Claim 4: a Pass@K interval holding 0 but wider than this says too little to call Pass@K flat."""
CEILING = 0.95
EV_HARD = 0.5
KL_ROUNDING = 1e-9
"""Claim 3: |E_pi[k] - KL| (and -k3) up to this many nats is float64 rounding over the vocabulary's sum."""
NOISE_SE = 2.0


@dataclass(frozen=True)
class Verdict:
    word: str
    sentence: str

    def __str__(self) -> str:
        return f"**{self.word}**: {self.sentence}"


def _combine(verdicts: Sequence[Verdict]) -> str:
    words = {v.word for v in verdicts}
    return NOT_HELD if NOT_HELD in words else INCONCLUSIVE if INCONCLUSIVE in words else HELD


def critic_verdict(grpo: Mapping[str, Any], ppo: Mapping[str, Any], explained_var: Sequence[float]) -> Verdict:
    """Claim 1 from compare.summarise's rows of the two runs and PPO's train/value_explained_var per step."""
    fails = []
    extra = set(ppo["models_loaded"]) - set(grpo["models_loaded"])
    if extra != {"value"} or set(grpo["models_loaded"]) - set(ppo["models_loaded"]):
        fails.append(f"PPO loaded {ppo['models_loaded']} and GRPO {grpo['models_loaded']}")
    if (ppo["params_total"] - grpo["params_total"]) != (ppo.get("params_value") or 0):
        fails.append("the parameter difference is not the critic's")
    mem = (ppo["peak_mem_mb"] or 0) - (grpo["peak_mem_mb"] or 0)
    step = (ppo["time_step_s"] or 0) - (grpo["time_step_s"] or 0)
    if mem <= 0:
        fails.append(f"PPO's peak memory was not above GRPO's ({ppo['peak_mem_mb']:.0f} vs {grpo['peak_mem_mb']:.0f} MB)")
    if step <= 0:
        fails.append(f"PPO's step was not slower ({ppo['time_step_s']:.1f} vs {grpo['time_step_s']:.1f} s)")
    ev = [v for v in explained_var if not math.isnan(v)]
    tail = ev[-max(1, len(ev) // 3) :] if ev else []
    fit = statistics.fmean(tail) if tail else math.nan
    fit_words = (
        "no explained variance was logged"
        if not tail
        else f"the critic's explained variance of the returns, over the last third of the steps, was {fit:.2f}"
        + (f" (below {EV_HARD}: hard to fit)" if fit < EV_HARD else "")
    )
    if fails:
        return Verdict(NOT_HELD, f"not held on this model, because {'; '.join(fails)}; {fit_words}.")
    value = ppo.get("params_value") or 0
    return Verdict(
        HELD,
        f"GRPO loaded {len(grpo['models_loaded'])} models, PPO {len(ppo['models_loaded'])}: the critic adds "
        f"{value / 1e6:.1f}M parameters ({value / grpo['params_policy']:.2f}x the policy), {mem:.0f} MB of peak "
        f"memory (+{mem / grpo['peak_mem_mb']:.0%}) and {step:.1f} s per step (+{step / grpo['time_step_s']:.0%}); "
        f"{fit_words}.",
    )


def _rising(values: Sequence[float]) -> bool:
    return all(b > a for a, b in zip(values, values[1:], strict=False))


def _proportion_se(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """Standard error of the difference of two shares of groups (each over its run's groups)."""
    return math.sqrt(sum(r["zero_spread"] * (1 - r["zero_spread"]) / max(r.get("groups", 1), 1) for r in (a, b)))


def group_verdict(rows: Sequence[Mapping[str, Any]]) -> Verdict:
    """Claim 2 from one row per G (sorted by G): g, time_step_s, peak_mem_mb, zero_spread (over ``groups``
    groups), gain_per_min. The share without spread is noisy (a few dozen groups): a rise within NOISE_SE
    standard errors of the difference is not counted against the claim, and the sentence gives the numbers."""
    rows = sorted(rows, key=lambda r: r["g"])
    gs = [r["g"] for r in rows]
    fails = []
    if not _rising([r["time_step_s"] for r in rows]):
        fails.append("time per step did not rise with G")
    if not _rising([r["peak_mem_mb"] for r in rows]):
        fails.append("peak memory did not rise with G")
    rose = [
        (a["g"], b["g"])
        for a, b in zip(rows, rows[1:], strict=False)
        if b["zero_spread"] - a["zero_spread"] > NOISE_SE * _proportion_se(a, b)
    ]
    if rose:
        fails.append(
            "the share of groups without reward spread rose from G=" + ", G=".join(f"{a} to {b}" for a, b in rose)
            + f" by more than {NOISE_SE:g} standard errors"
        )
    best = max(rows, key=lambda r: r["gain_per_min"])
    def column(key: str, fmt: str) -> str:
        return ", ".join(format(r[key], fmt) for r in rows)

    numbers = (
        f"G={gs}: {column('time_step_s', '.1f')} s per step, {column('peak_mem_mb', '.0f')} MB peak, "
        f"{column('zero_spread', '.2f')} of the groups without reward spread; the best greedy-accuracy gain per "
        f"training minute was G={best['g']} ({best['gain_per_min']:+.3f} per min)"
    )
    if fails:
        return Verdict(NOT_HELD, f"not held on this model, because {'; '.join(fails)} ({numbers}).")
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


def overall(verdicts: Sequence[Verdict]) -> Verdict:
    """Claims with a verdict per part (4: per kind): one word, the parts' sentences."""
    return Verdict(_combine(verdicts), " ".join(v.sentence for v in verdicts))


def hacking_verdict(rm_runs: Mapping[str, HackingNumbers], contrast: HackingNumbers | None) -> Verdict:
    """Claim 5 from the analysis of each run on the reward model, and of the rule-reward run."""
    hacked = [name for name, n in rm_runs.items() if n.hacked]
    parts = [
        f"{name}: proxy {n.proxy_start:.3f} -> {n.proxy_end:.3f}, gold {n.gold_start:.3f} -> peak {n.gold_peak:.3f} "
        f"(step {n.peak_step}) -> {n.gold_end:.3f}, sqrt(KL) {n.sqrt_kl_end:.2f} at the end"
        for name, n in rm_runs.items()
    ]
    if contrast is not None:
        parts.append(
            f"the rule reward as the training reward: gold {contrast.gold_start:.3f} -> {contrast.gold_end:.3f} at "
            f"sqrt(KL) {contrast.sqrt_kl_end:.2f}"
        )
    text = "; ".join(parts)
    if hacked:
        return Verdict(HELD, f"the proxy rose while the gold fell in {', '.join(hacked)}: {text}.")
    drop = max((n.min_drop for n in rm_runs.values()), default=0.05)
    pushed = max((n.sqrt_kl_end for n in rm_runs.values() if not math.isnan(n.sqrt_kl_end)), default=math.nan)
    return Verdict(
        NOT_HELD,
        f"not held within this budget: in no run did the gold fall by more than {drop:g} after its peak while the "
        f"proxy held or rose (the policy was pushed as far as sqrt(KL) {pushed:.2f}, KL in nats per sequence); {text}.",
    )
