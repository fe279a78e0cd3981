"""The KL estimators against the exact KL, on the same samples (``grpolab claims``, claim 3).

GRPO puts the KL in the loss with k3 = ref/pi - log(ref/pi) - 1 (DeepSeekMath Eq. 4); PPO puts k1 =
log(pi/ref) in the per-token reward. Both are unbiased for KL(pi || ref) on tokens sampled from pi; k3
is never negative, k1 is negative wherever the reference likes the sampled token more than the policy.

Unbiasedness is a statement about the expectation under pi, and at each position that expectation is a
finite sum over the vocabulary, so it is computed exactly rather than estimated by a sample mean:
E_pi[k1] = sum_v pi(v) log(pi(v)/ref(v)) = KL, and E_pi[k3] = sum_v ref(v) - 1 + KL = KL. At each
counted position of completions sampled from the policy at temperature 1 (no top-p / top-k: exactly pi)
this module computes, in float64 over the whole vocabulary:

* the exact KL(pi || ref);
* each estimator's exact expectation and variance under pi (bias = expectation - KL, which should be
  float rounding; the variance is what makes a sample mean near or far from it);
* k3 as ``grpolab.algo.kl.kl_k3`` computes it (its log-ratio clamped to +-20) beside the unclamped
  formula: the clamp's own bias, sum over the clamped tokens of pi * (true ratio - clamped ratio), is
  reported apart from the estimator's;
* the smallest k3 over the whole vocabulary, and k1 / k3 of the token actually sampled (the sample
  means, the share of negative k1, and the paired standard errors are reported as before).

The full-vocabulary distributions are formed a chunk of positions at a time, from the models' last hidden
states and output heads, never as one [N, T, V] tensor.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from grpolab.algo.kl import kl_k1, kl_k3
from grpolab.eval.intervals import mean_and_se
from grpolab.models.chunked_head import output_head
from grpolab.rollout.base import Sampler, without_failures

POSITIONS_PER_CHUNK = 64
"""Positions whose full next-token distributions are formed at once (x vocabulary x 2 models, float64)."""

KL_BINS = (0.01, 0.1)
"""Exact per-position KL (nats) separating near (< 0.01), middle and far (>= 0.1) positions, for the variances."""


@dataclass(frozen=True)
class KLMeasure:
    """Per-token KL(pi || ref) on one set of samples: the exact value and the two estimators."""

    tokens: int
    sequences: int
    exact_mean: float
    """Mean over tokens of the exact per-position KL (nats per token)."""
    k1_mean: float
    k1_se: float
    k3_mean: float
    k3_se: float
    k1_negative_share: float
    """Share of tokens with k1 < 0."""
    k1_min: float
    k3_min: float
    k1_bias_se: float
    """Standard error of the mean of (k1 - exact) over tokens: the estimator's error, paired per token."""
    k3_bias_se: float
    exact_seq_mean: float
    """Mean over sequences of the summed exact KL (nats per sequence)."""
    k1_bias_max: float
    """Largest |E_pi[k1] - KL| over the positions, each computed exactly over the vocabulary (nats)."""
    k3_bias_max: float
    """Largest |E_pi[k3] - KL| over the positions, k3's formula without the clamp (nats)."""
    bias_rel_max: float
    """Largest |E_pi[k] - KL| / KL of either estimator over positions with KL >= 1e-6."""
    clamp_bias_mean: float
    """Mean over positions of E_pi[k3 as implemented, clamped] - E_pi[k3] (<= 0: the clamp's own bias)."""
    k3_vocab_min: float
    """Smallest k3 over every vocabulary entry at every position (the formula, unclamped)."""
    variance: dict[str, dict[str, float]]
    """Bin ("near", "middle", "far" by the exact per-position KL, and "all") -> positions, mean exact KL and the
    mean over its positions of Var_pi[k1] and Var_pi[k3]."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def position_moments(logp: torch.Tensor, logq: torch.Tensor) -> dict[str, torch.Tensor]:
    """Exact moments under pi at each position from full next-token log-probs ``logp`` (pi) and ``logq`` (ref),
    both ``[M, V]``; computed in float64. Each value is ``[M]``.

    kl: sum_v pi (log pi - log ref); e1, v1 / e3, v3: expectation and variance under pi of k1 and of k3's
    formula (unclamped); e3_impl: the expectation of ``kl_k3`` as implemented (clamped); k3_min: the
    smallest k3 over the vocabulary.
    """
    logp, logq = logp.double(), logq.double()
    p = logp.exp()
    k1 = kl_k1(logp, logq)
    x = logq - logp
    k3 = torch.expm1(x) - x  # the formula itself, no clamp; float64 holds exp(x) for any |x| < 700
    e1, e3 = (p * k1).sum(-1), (p * k3).sum(-1)
    return {
        "kl": (p * (logp - logq)).sum(-1),
        "e1": e1,
        "v1": (p * k1.square()).sum(-1) - e1.square(),
        "e3": e3,
        "v3": (p * k3.square()).sum(-1) - e3.square(),
        "e3_impl": (p * kl_k3(logp, logq)).sum(-1),
        "k3_min": k3.min(-1).values,
    }


def token_kls(policy, reference, prompt_ids: list[int], completion_ids: torch.Tensor, mask: torch.Tensor):
    """(k1, k3, exact, moments) of one prompt's G completions: k1, k3 of the sampled tokens and the exact KL,
    each a 1-D tensor over the counted tokens, and ``position_moments`` of those positions.

    ``completion_ids`` / ``mask``: [G, T] right-padded, True for the counted tokens.
    """
    device = completion_ids.device
    g, t = completion_ids.shape
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=device).expand(g, -1)
    ids = torch.cat([prompt, completion_ids], dim=1)
    attention = torch.cat([torch.ones_like(prompt, dtype=torch.bool), mask], dim=1).long()
    first = len(prompt_ids) - 1  # the hidden state at this position predicts completion token 0
    logp, logq, kl = [], [], []
    for model, out in ((policy, logp), (reference, logq)):
        hidden = model.get_decoder()(input_ids=ids, attention_mask=attention).last_hidden_state
        hidden = hidden[:, first : first + t][mask]  # [M, H]: the counted positions only
        head = output_head(model)
        weight = head.weight.float()
        bias = None if head.bias is None else head.bias.float()
        for start in range(0, hidden.shape[0], POSITIONS_PER_CHUNK):
            logits = F.linear(hidden[start : start + POSITIONS_PER_CHUNK].float(), weight, bias)
            out.append(F.log_softmax(logits.double(), -1))  # float64: sum_v ref(v) = 1 to rounding
    targets = completion_ids[mask]
    tok_p, tok_q, moments = [], [], []
    for start, (lp, lq) in zip(range(0, targets.shape[0], POSITIONS_PER_CHUNK), zip(logp, logq, strict=True), strict=True):
        chunk = targets[start : start + POSITIONS_PER_CHUNK, None]
        tok_p.append(lp.gather(-1, chunk).squeeze(-1))
        tok_q.append(lq.gather(-1, chunk).squeeze(-1))
        kl.append((lp.exp() * (lp - lq)).sum(-1))
        moments.append(position_moments(lp, lq))
    if not kl:
        empty = torch.zeros(0, device=device)
        return empty, empty, empty, {}
    lp_tok, lq_tok = torch.cat(tok_p), torch.cat(tok_q)
    merged = {key: torch.cat([m[key] for m in moments]) for key in moments[0]}
    return kl_k1(lp_tok, lq_tok), kl_k3(lp_tok, lq_tok), torch.cat(kl), merged


@torch.no_grad()
def measure_kl(
    policy, reference, sampler: Sampler, prompts: Sequence[list[int]], *, num_generations: int, seed: int
) -> KLMeasure:
    """Sample ``num_generations`` completions of each prompt from ``policy`` and measure KL(pi || ref).

    ``sampler`` samples ``policy`` exactly: at T=1, without top-p, top-k, min-p or a repetition penalty, in
    full precision (runtime/eval_spec.py ``kl_sampler``); it is closed here, once sampled, so that its memory
    is free for the full-vocabulary forwards."""
    device = next(policy.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    k1s, k3s, exact, seq_kl, moments = [], [], [], [], []
    try:
        comps = without_failures(sampler.sample(list(prompts), num_generations=num_generations, generator=generator), "the KL measure")
    finally:
        sampler.close()
    ids, mask = comps.completion_ids.to(device), comps.model_mask.to(device)
    for p, prompt in enumerate(prompts):
        rows = slice(p * num_generations, (p + 1) * num_generations)
        k1, k3, kl, m = token_kls(policy, reference, prompt, ids[rows], mask[rows])
        if m:
            moments.append(m)
        k1s.append(k1)
        k3s.append(k3)
        exact.append(kl)
        counts = mask[rows].sum(1).tolist()
        seq_kl += [float(part.sum()) for part in torch.split(kl, counts)]
    k1_all, k3_all, kl_all = (torch.cat(x).double().cpu() for x in (k1s, k3s, exact))
    if k1_all.numel() == 0:
        raise ValueError("measure_kl: the samples hold no counted token (every completion empty)")
    k1_mean, k1_se = mean_and_se(k1_all.tolist())
    k3_mean, k3_se = mean_and_se(k3_all.tolist())
    _, k1_bias_se = mean_and_se((k1_all - kl_all).tolist())
    _, k3_bias_se = mean_and_se((k3_all - kl_all).tolist())
    m = {key: torch.cat([part[key] for part in moments]).cpu() for key in moments[0]}
    return KLMeasure(
        tokens=int(k1_all.numel()),
        sequences=len(seq_kl),
        exact_mean=float(kl_all.mean()),
        k1_mean=k1_mean,
        k1_se=k1_se,
        k3_mean=k3_mean,
        k3_se=k3_se,
        k1_negative_share=float((k1_all < 0).double().mean()),
        k1_min=float(k1_all.min()),
        k3_min=float(k3_all.min()),
        k1_bias_se=k1_bias_se,
        k3_bias_se=k3_bias_se,
        exact_seq_mean=math.fsum(seq_kl) / len(seq_kl),
        **exact_summary(m),
    )


def exact_summary(m: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The KLMeasure fields computed from ``position_moments`` of every counted position."""
    kl = m["kl"]
    errors = torch.stack([(m["e1"] - kl).abs(), (m["e3"] - kl).abs()])
    real = kl >= 1e-6
    rel = (errors[:, real] / kl[real]).max() if bool(real.any()) else torch.tensor(0.0)
    bins = {"near": kl < KL_BINS[0], "middle": (kl >= KL_BINS[0]) & (kl < KL_BINS[1]), "far": kl >= KL_BINS[1],
            "all": torch.ones_like(kl, dtype=torch.bool)}
    variance = {
        name: {"positions": int(sel.sum()), "kl_mean": float(kl[sel].mean()) if bool(sel.any()) else math.nan,
               "k1_var": float(m["v1"][sel].mean()) if bool(sel.any()) else math.nan,
               "k3_var": float(m["v3"][sel].mean()) if bool(sel.any()) else math.nan}
        for name, sel in bins.items()
    }
    return {
        "k1_bias_max": float(errors[0].max()),
        "k3_bias_max": float(errors[1].max()),
        "bias_rel_max": float(rel),
        "clamp_bias_mean": float((m["e3_impl"] - m["e3"]).mean()),
        "k3_vocab_min": float(m["k3_min"].min()),
        "variance": variance,
    }
