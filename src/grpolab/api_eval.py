"""``GRPOTrainer.evaluate()``: TRL's evaluation of GRPO on ``eval_dataset``, with TRL's metric names.

TRL evaluates by generating ``num_generations_eval`` completions for each eval prompt, at the training
temperature, scoring them with the reward functions and logging the same statistics as a training step,
each prefixed ``eval_``. grpolab does the same with the policy being trained and the sampler of
``rollout.engine`` (built as ``grpolab eval`` builds it, rollout/engines.py) over the very model object, so
a call between steps sees the weights of the last step.

``eval_loss`` is TRL's: the loss of each eval batch (its groups' advantages, the reference's KL when beta > 0,
the entropy bonus) at the weights that sampled it, so the importance ratio is 1 (training/step.py
``evaluation_loss``), averaged over the batches weighted by their completions, as transformers' evaluation
loop averages prediction_step's losses. A batch is ``PROMPTS_PER_BATCH`` prompts here, TRL's
``per_device_eval_batch_size`` completions: with group advantages the policy term is about zero either way (a
group's advantages sum to zero), the KL and the entropy bonus are means. PPO (a critic) and process supervision
have no such loss in TRL's GRPO: left out there.
"""

from __future__ import annotations

import dataclasses
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
from grpolab.runtime.engine_spec import engine_spec
from grpolab.runtime.step_spec import batch_spec, logprob_context, policy_loss_spec
from grpolab.training.batch import outcome_estimator, reward_parts, rewards_tensor
from grpolab.training.ppo import rollout_batch_builder
from grpolab.training.step import evaluation_loss
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
    *,
    reference=None,
    entropy_coef: float | None = None,
) -> dict[str, float]:
    """TRL's eval metrics of ``model`` on ``examples``: ``<prefix>_loss``, ``_reward``, ``_reward_std``,
    ``_rewards/<name>/mean`` and ``/std``, ``_frac_reward_zero_std``, ``_completions/*`` and the runtime keys.
    ``reference``: the run's (a models.loading.Reference; None with beta 0); ``entropy_coef``: the bonus's
    coefficient the next training step would apply (default algo.entropy_coef)."""
    started = time.perf_counter()
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    amp = resolve_autocast(cfg.model, device)
    sampler = build_sampler(engine_spec(cfg), policy=model, tokenizer=tokenizer, autocast_dtype=amp)
    loss_of = _loss_of_batch(cfg, model, tokenizer, rewards, (reference, device, amp), entropy_coef)
    losses: list[tuple[float, int]] = []
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
            if loss_of is not None:
                losses.append((loss_of(comps, prompt_ids[start : start + len(chunk)], scores), comps.num_sequences))
    finally:
        sampler.close()
        model.train(was_training)
    metrics = trl_eval_metrics(totals, components, lengths, truncated, num_generations)
    if losses:
        metrics = {"loss": sum(v * n for v, n in losses) / sum(n for _, n in losses), **metrics}
    runtime = time.perf_counter() - started
    metrics.update(
        {
            "runtime": runtime,
            "samples_per_second": len(totals) / max(runtime, 1e-9),
            "steps_per_second": 1 / max(runtime, 1e-9),
        }
    )
    return {f"{prefix}_{key}": value for key, value in metrics.items()}


def _loss_of_batch(cfg: Config, model, tokenizer, rewards, where, entropy_coef: float | None):
    """``(completions, prompt_ids, scores) -> loss``: an eval batch's advantages (the training estimator, over the
    batch), reference log-probs, and TRL's eval loss of it; None for PPO and process supervision. ``where`` is
    (the Reference or None, the model's device, its autocast dtype)."""
    a = cfg.algo
    if a.needs_critic or a.supervision != "outcome":
        return None
    reference, device, amp = where
    ctx = logprob_context(cfg, pad_id=tokenizer.pad_token_id, autocast_dtype=amp, device_type=device.type)
    spec = dataclasses.replace(batch_spec(cfg, ctx), recompute_old_logprobs=False)  # the ratio is 1: no old forward
    estimator = outcome_estimator(a.advantage, std=a.std, eps=a.eps, beta=a.beta, gamma=a.gamma)
    build = rollout_batch_builder(spec, None, estimator)
    loss_spec = policy_loss_spec(cfg)
    if entropy_coef is not None:
        loss_spec = dataclasses.replace(loss_spec, entropy_coef=entropy_coef)
    weights = {r.name: r.weight for r in rewards}

    def loss_of(comps, prompt_ids, scores) -> float:
        totals, valid = rewards_tensor(scores.total, len(prompt_ids), comps.num_generations)
        parts = reward_parts(scores.components, weights, totals.shape) if a.advantage == "gdpo" else None
        batch, _ = build(comps, prompt_ids, totals, valid, policy=model, reference=reference, parts=parts)
        return evaluation_loss(model, batch, ctx, loss_spec)

    return loss_of


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
