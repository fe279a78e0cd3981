"""``GRPOTrainer.evaluate()``: TRL's evaluation of GRPO on ``eval_dataset``, with TRL's metric names.

TRL evaluates by generating ``num_generations_eval`` completions for each eval prompt, at the training
temperature, scoring them with the reward functions and logging the same statistics as a training step,
each prefixed ``eval_``. grpolab does the same with the policy being trained and the sampler of
``rollout.engine`` (built as ``grpolab eval`` builds it, rollout/engines.py) over the very model object, so
a call between steps sees the weights of the last step.

What departs from TRL, and why: ``eval_loss`` is left out. TRL's is the GRPO loss of the eval batch at the
weights that sampled it, where the importance ratio is 1 and each group's advantages sum to zero: it is
about zero whatever the model does (plus beta times the KL when beta > 0), a number no one can act on.
``eval_reward`` and ``eval_rewards/<name>/mean`` are what a TRL user reads.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import torch

from grpolab.config import Config
from grpolab.data import tokenize_prompts
from grpolab.models.loading import resolve_autocast
from grpolab.rewards import WeightedReward, score_batch
from grpolab.rollout.base import without_failures
from grpolab.rollout.engines import build_sampler
from grpolab.types import Example

PROMPTS_PER_BATCH = 32
"""Eval prompts sampled together (each with its ``num_generations`` completions)."""


def evaluate_policy(
    cfg: Config,
    model: torch.nn.Module,
    tokenizer: Any,
    rewards: Sequence[WeightedReward],
    examples: Sequence[Example],
    num_generations: int,
    prefix: str = "eval",
) -> dict[str, float]:
    """TRL's eval metrics of ``model`` on ``examples``: ``<prefix>_reward``, ``_reward_std``,
    ``_rewards/<name>/mean`` and ``/std``, ``_frac_reward_zero_std``, ``_completions/*`` and the runtime keys."""
    started = time.perf_counter()
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    sampler = build_sampler(cfg, policy=model, tokenizer=tokenizer, autocast_dtype=resolve_autocast(cfg.model, device))
    generator = torch.Generator(device=device).manual_seed(cfg.seed)  # every evaluation draws the same stream
    prompt_ids = tokenize_prompts(examples, tokenizer, cfg.data)
    totals: list[float | None] = []
    components: dict[str, list[float | None]] = {}
    lengths: list[int] = []
    truncated: list[bool] = []
    try:
        for start in range(0, len(examples), PROMPTS_PER_BATCH):
            chunk = examples[start : start + PROMPTS_PER_BATCH]
            comps = sampler.sample(prompt_ids[start : start + len(chunk)], num_generations=num_generations, generator=generator)
            comps = without_failures(comps, "evaluate()")
            repeated = [e for e in chunk for _ in range(num_generations)]
            scores = score_batch(rewards, comps.items(), repeated, timeout_s=cfg.reward.timeout_s)
            totals += scores.total
            for name, values in scores.components.items():
                components.setdefault(name, []).extend(values)
            lengths += [int(n) for n in comps.lengths.tolist()]
            truncated += [reason == "length" for reason in comps.finish_reasons]
    finally:
        sampler.close()
        model.train(was_training)
    metrics = trl_eval_metrics(totals, components, lengths, truncated, num_generations)
    runtime = time.perf_counter() - started
    metrics.update(
        {
            "runtime": runtime,
            "samples_per_second": len(totals) / max(runtime, 1e-9),
            "steps_per_second": 1 / max(runtime, 1e-9),
        }
    )
    return {f"{prefix}_{key}": value for key, value in metrics.items()}


def trl_eval_metrics(
    totals: Sequence[float | None],
    components: dict[str, Sequence[float | None]],
    lengths: Sequence[int],
    truncated: Sequence[bool],
    num_generations: int,
) -> dict[str, float]:
    """The statistics TRL logs for a batch of groups of ``num_generations`` (grpo_trainer's
    ``_generate_and_score_completions``), unprefixed. A None total (no reward applied) counts as NaN and is left
    out of the means, as TRL's nanmean; ``reward_std`` is the unbiased std, as torch's."""
    total = torch.tensor([math.nan if t is None else float(t) for t in totals], dtype=torch.float64)
    groups = total.view(-1, num_generations)
    out: dict[str, float] = {"reward": _nanmean(total), "reward_std": _nanstd(total)}
    out["frac_reward_zero_std"] = float(sum(_nanstd(g) < 1e-8 for g in groups) / len(groups))
    for name, values in components.items():
        column = torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float64)
        out[f"rewards/{name}/mean"] = _nanmean(column)
        out[f"rewards/{name}/std"] = _nanstd(column)
    length = torch.tensor(list(lengths), dtype=torch.float64)
    out.update(
        {
            "completions/mean_length": float(length.mean()),
            "completions/min_length": float(length.min()),
            "completions/max_length": float(length.max()),
            "completions/clipped_ratio": sum(truncated) / len(truncated),
        }
    )
    ended = length[~torch.tensor(list(truncated), dtype=torch.bool)]
    out["completions/mean_terminated_length"] = float(ended.mean()) if len(ended) else 0.0
    return out


def _nanmean(x: torch.Tensor) -> float:
    kept = x[~x.isnan()]
    return float(kept.mean()) if len(kept) else math.nan


def _nanstd(x: torch.Tensor) -> float:
    kept = x[~x.isnan()]
    return float(kept.std()) if len(kept) > 1 else 0.0
