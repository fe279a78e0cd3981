"""The KL estimators against the exact KL, on the same samples (``grpolab claims``, claim 3).

GRPO puts the KL in the loss with k3 = ref/pi - log(ref/pi) - 1 (DeepSeekMath Eq. 4); PPO puts k1 =
log(pi/ref) in the per-token reward. Both are unbiased for KL(pi || ref) on tokens sampled from pi; k3
is never negative, k1 is negative wherever the reference likes the sampled token more than the policy.
Here each counted token of completions sampled from the policy at temperature 1 (no top-p / top-k:
exactly pi) gets k1 and k3 of its sampled token and the exact KL of the two next-token distributions,
sum_v pi(v) (log pi(v) - log ref(v)), which the estimators estimate. The full-vocabulary distributions
are formed a chunk of positions at a time, from the models' last hidden states and output heads, never
as one [N, T, V] tensor.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from grpolab.algo.kl import kl_k1, kl_k3
from grpolab.config import Config
from grpolab.eval.intervals import mean_and_se
from grpolab.models.chunked_head import output_head
from grpolab.rollout.base import without_failures
from grpolab.rollout.engines import build_sampler

POSITIONS_PER_CHUNK = 256
"""Positions whose full next-token distributions are formed at once (x vocabulary x 2 models)."""


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

    def to_json(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def token_kls(policy, reference, prompt_ids: list[int], completion_ids: torch.Tensor, mask: torch.Tensor):
    """(k1, k3, exact) of one prompt's G completions, each a 1-D tensor over the counted tokens.

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
            out.append(F.log_softmax(F.linear(hidden[start : start + POSITIONS_PER_CHUNK].float(), weight, bias), -1))
    targets = completion_ids[mask]
    tok_p, tok_q = [], []
    for start, (lp, lq) in zip(range(0, targets.shape[0], POSITIONS_PER_CHUNK), zip(logp, logq, strict=True), strict=True):
        chunk = targets[start : start + POSITIONS_PER_CHUNK, None]
        tok_p.append(lp.gather(-1, chunk).squeeze(-1))
        tok_q.append(lq.gather(-1, chunk).squeeze(-1))
        kl.append((lp.exp() * (lp - lq)).sum(-1))
    if not kl:
        empty = torch.zeros(0, device=device)
        return empty, empty, empty
    lp_tok, lq_tok = torch.cat(tok_p), torch.cat(tok_q)
    return kl_k1(lp_tok, lq_tok), kl_k3(lp_tok, lq_tok), torch.cat(kl)


@torch.no_grad()
def measure_kl(
    policy, reference, tok, prompts: Sequence[list[int]], cfg: Config, *, num_generations: int, seed: int
) -> KLMeasure:
    """Sample ``num_generations`` completions of each prompt from ``policy`` at T=1 and measure KL(pi || ref)."""
    rollout = dataclasses.replace(cfg.rollout, temperature=1.0, top_p=1.0, top_k=0)
    sampler = build_sampler(
        dataclasses.replace(cfg, rollout=rollout), policy=policy, tokenizer=tok, autocast_dtype=None, temperature=1.0
    )
    device = next(policy.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    k1s, k3s, exact, seq_kl = [], [], [], []
    try:
        comps = without_failures(sampler.sample(list(prompts), num_generations=num_generations, generator=generator), "the KL measure")
    finally:
        sampler.close()
    ids, mask = comps.completion_ids.to(device), comps.model_mask.to(device)
    for p, prompt in enumerate(prompts):
        rows = slice(p * num_generations, (p + 1) * num_generations)
        k1, k3, kl = token_kls(policy, reference, prompt, ids[rows], mask[rows])
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
    )
