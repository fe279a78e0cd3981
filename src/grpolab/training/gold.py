"""Gold rewards and the KL from the reference, measured on every training batch and never trained on.

The instrument of Gao et al., "Scaling Laws for Reward Model Overoptimization" (arXiv 2210.10760):
optimise a proxy reward (``reward.functions``) and watch a gold reward (``reward.gold``) as the policy
moves away from where it started, the distance measured as KL(pi || pi_ref) in nats per sequence.

What is measured, and how:
* gold rewards score the same sampled completions as the proxy, after it, on the step's training
  prompts: the policy's on-policy gold reward at that step, at no extra sampling cost. They enter no
  tensor the update reads (``RolloutBatch`` is built before they run), so a run with and without them
  makes the same updates.
* ``train/kl_seq`` = mean over the batch of sum_t (log pi_old - log pi_ref) over the counted tokens,
  with pi_old the sampler's log-probs of the sampled tokens: a Monte-Carlo estimate of
  KL(pi_old || pi_ref) per sequence (Gao et al. plot against sqrt of it). With a KL penalty the loop's
  reference is reused (so after an ``algo.ref_reset_every`` reset it is the KL from the new reference);
  at beta = 0 a frozen copy of the starting policy is made here, used for nothing but this number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from grpolab.config import RewardSpec
from grpolab.models.loading import Reference
from grpolab.rewards import WeightedReward, build_rewards, score_batch
from grpolab.training.spec import LogprobContext
from grpolab.types import Completions, Example, RolloutBatch


def build_gold_rewards(gold: Sequence[RewardSpec]) -> list[WeightedReward]:
    """reward.gold (``gold``) built with the same checks and messages as reward.functions (naming
    ``reward.gold[i]``); none: []."""
    if not gold:
        return []
    return build_rewards(gold, key="reward.gold")


def gold_metrics(rewards: Sequence[WeightedReward], scores, prefix: str) -> dict[str, float]:
    """``<prefix>/gold/<name>`` (mean over the samples it applies to) and ``<prefix>/gold_total``."""
    out = {}
    for wr in rewards:
        out[f"{prefix}/gold/{wr.name}"] = _mean(scores.components[wr.name])
    out[f"{prefix}/gold_total"] = _mean(scores.total)
    return out


def _mean(values: Sequence[float | None]) -> float:
    kept = [v for v in values if v is not None]
    return math.fsum(kept) / len(kept) if kept else math.nan


class GoldMonitor:
    """Scores each step's completions with the gold rewards and measures the KL from the reference."""

    def __init__(self, rewards: list[WeightedReward], reference: Reference | None, ctx, timeout_s: float):
        self.rewards = rewards
        self.reference = reference
        """The reference the KL is measured from; None when nothing is measured."""
        self.ctx = ctx
        self.timeout_s = timeout_s
        self._last_total: list[float | None] | None = None

    @classmethod
    def build(
        cls, rewards: list[WeightedReward], policy, reference: Reference | None, ctx: LogprobContext, *,
        measure_kl: bool, timeout_s: float,
    ) -> GoldMonitor:
        """``reference`` is the loop's (None without a KL penalty); one is made here only to measure (reward.gold
        or reward.measure_kl), under ``ctx``'s autocast. ``timeout_s``: reward.timeout_s."""
        if not rewards and not measure_kl:
            return cls([], None, ctx, timeout_s)
        measured_from = reference if reference is not None else Reference(policy, ctx.autocast_dtype)
        return cls(rewards, measured_from, ctx, timeout_s)

    @property
    def active(self) -> bool:
        return self.reference is not None

    def measure(
        self, completions: Completions, examples: list[Example], batch: RolloutBatch
    ) -> dict[str, float]:
        """train/gold/<name>, train/gold_total and train/kl_seq for this step ({} when off)."""
        if not self.active:
            return {}
        metrics: dict[str, float] = {}
        if self.rewards:
            scores = score_batch(self.rewards, completions.items(), examples, timeout_s=self.timeout_s)
            self._last_total = scores.total
            metrics.update(gold_metrics(self.rewards, scores, "train"))
        kl = sequence_kl(completions, self._ref_logprobs(completions, batch))
        metrics["train/kl_seq"] = float(kl.mean())
        metrics["train/kl_seq_std"] = float(kl.std()) if kl.numel() > 1 else 0.0
        return metrics

    def annotate(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """samples.jsonl rows with each completion's gold total (``gold``) added."""
        if self._last_total is None:
            return rows
        return [{**row, "gold": g} for row, g in zip(rows, self._last_total, strict=True)]

    def _ref_logprobs(self, completions: Completions, batch: RolloutBatch) -> torch.Tensor:
        if batch.ref_logprobs is not None:
            return batch.ref_logprobs
        with self.reference.model() as ref_model:
            return self.ctx.logprobs(
                ref_model, batch.prompt_ids, completions.completion_ids, completions.completion_mask
            )


def sequence_kl(completions: Completions, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """[N] sum_t (log pi_old - log pi_ref) over each completion's counted tokens, in nats."""
    mask = completions.completion_mask
    sampled = completions.logprobs.to(ref_logprobs.device)
    return ((sampled - ref_logprobs) * mask.to(ref_logprobs.device)).sum(-1).double().cpu()
