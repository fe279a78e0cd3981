"""From sampled completions and their rewards to a RolloutBatch: advantages, reference and old log-probs."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from grpolab.algo.advantages import OUTCOME_ESTIMATORS, grpo_process_advantages
from grpolab.config import Config
from grpolab.models import Reference
from grpolab.train.logprobs import completion_logprobs
from grpolab.train.microbatch import prompt_lengths_of, split_rows
from grpolab.train.process import StepRewards
from grpolab.types import Completions, RolloutBatch

AdvantageFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def outcome_estimator(cfg: Config) -> AdvantageFn:
    """The group advantage function [P, G] -> [P, G], chosen once from OUTCOME_ESTIMATORS."""
    name = cfg.algo.resolved_advantage
    if name not in OUTCOME_ESTIMATORS:
        raise ValueError(
            f"algo.advantage '{name}' is not an outcome estimator; known: {sorted(OUTCOME_ESTIMATORS)}"
        )
    return functools.partial(OUTCOME_ESTIMATORS[name], std=cfg.algo.std, eps=cfg.algo.eps)


def rewards_tensor(total: Sequence[float | None], num_prompts: int, num_generations: int):
    """(rewards [P, G] with 0 where not applicable, valid [P, G] bool)."""
    valid = torch.tensor([r is not None for r in total], dtype=torch.bool).view(num_prompts, num_generations)
    values = torch.tensor([0.0 if r is None else float(r) for r in total], dtype=torch.float32)
    return values.view(num_prompts, num_generations), valid


@dataclass
class LogprobContext:
    """What computing log-probs of a batch needs, besides the model."""

    pad_id: int
    temperature: float
    autocast_dtype: torch.dtype | None
    micro_batch_size: int
    max_tokens: int | None = None
    """train.max_tokens_per_micro_batch: padded tokens per forward (None = rows only)."""

    @torch.no_grad()
    def logprobs(self, model, prompt_ids, completion_ids, completion_mask) -> torch.Tensor:
        """[N, T] log-probs without a graph, in micro-batches."""

        def run(prompts, ids, mask):
            return completion_logprobs(
                model, prompts, ids, mask, pad_id=self.pad_id, temperature=self.temperature, autocast_dtype=self.autocast_dtype
            )[0]

        return self.map_rows(run, prompt_ids, completion_ids, completion_mask)

    def map_rows(self, fn, prompt_ids, completion_ids, completion_mask) -> torch.Tensor:
        """fn(prompts, completion_ids, completion_mask) -> [n, T] over micro-batches, rows in their order."""
        rows = torch.arange(len(prompt_ids))
        if self.max_tokens is None:
            parts = list(rows.split(self.micro_batch_size))
        else:
            lengths = completion_mask.sum(-1).cpu()
            parts = split_rows(
                rows, lengths, self.micro_batch_size, max_tokens=self.max_tokens, prompt_lengths=prompt_lengths_of(prompt_ids)
            )
        out = [fn([prompt_ids[i] for i in r.tolist()], completion_ids[r], completion_mask[r]) for r in parts]
        order = torch.cat(parts).to(completion_ids.device)
        result = torch.cat(out)
        return torch.empty_like(result).index_copy_(0, order, result)


def build_rollout_batch(
    cfg: Config,
    completions: Completions,
    prompt_ids: Sequence[Sequence[int]],
    rewards: torch.Tensor,
    valid: torch.Tensor,
    *,
    estimator: AdvantageFn,
    policy: torch.nn.Module,
    reference: Reference | None,
    ctx: LogprobContext,
    steps: StepRewards | None = None,
) -> tuple[RolloutBatch, dict[str, float]]:
    """Advantages, reference log-probs and, when needed, old log-probs.

    prompt_ids is [P]; each prompt is repeated G times, prompt-major, to match completions.
    Outcome supervision: ``estimator`` on the rewards [P, G], one value along T. Process supervision
    (``steps`` given): ``grpo_process_advantages`` on the step rewards, [N, T]; the logged [P, G]
    advantages are then each completion's first-token advantage.
    """
    g = completions.num_generations
    ids = [list(p) for p in prompt_ids for _ in range(g)]
    device = completions.completion_ids.device
    mask = completions.completion_mask
    loss_mask = mask & ~completions.truncated.to(device)[:, None] if cfg.algo.mask_truncated else mask
    ref_logprobs = None
    if reference is not None:
        with reference.model() as ref_model:
            ref_logprobs = ctx.logprobs(ref_model, ids, completions.completion_ids, mask)
    shaped = rewards
    if cfg.algo.resolved_kl_in == "reward" and ref_logprobs is not None:
        # RLOO-style: r_i - beta * sum_t log(pi/pi_ref), with the sampling log-probs as pi (no grad).
        seq_kl = ((completions.logprobs.to(device) - ref_logprobs) * mask).sum(-1).view_as(rewards).cpu()
        shaped = rewards - cfg.algo.beta * seq_kl
    if steps is None:
        advantages = estimator(shaped, valid)  # [P, G]
        adv_tokens = advantages.reshape(-1, 1).to(device).expand_as(mask).float() * mask
    else:
        adv_tokens = grpo_process_advantages(
            steps.step_rewards, steps.step_end_mask, mask, num_generations=g, std=cfg.algo.std, eps=cfg.algo.eps
        )
        advantages = adv_tokens[:, 0].reshape_as(rewards).cpu()
    old_logprobs = None
    if cfg.algo.mu > 1 or cfg.algo.num_minibatches > 1:
        old_logprobs = ctx.logprobs(policy, ids, completions.completion_ids, mask)
    batch = RolloutBatch(
        prompt_ids=ids,
        completion_ids=completions.completion_ids,
        completion_mask=mask,
        loss_mask=loss_mask,
        advantages=adv_tokens,
        old_logprobs=old_logprobs,
        ref_logprobs=ref_logprobs,
    )
    metrics = rollout_metrics(completions, rewards, valid, advantages)
    return batch, metrics if steps is None else {**metrics, **steps.metrics}


def rollout_metrics(
    completions: Completions, rewards: torch.Tensor, valid: torch.Tensor, advantages: torch.Tensor
) -> dict[str, float]:
    lengths = completions.lengths.float()
    ok = valid.float()
    group_has_signal = torch.tensor(
        [len(set(r[v].tolist())) > 1 for r, v in zip(rewards, valid, strict=True)], dtype=torch.float32
    )
    rv = rewards[valid]
    return {
        "train/reward_mean": float(rv.mean()) if rv.numel() else math.nan,
        "train/reward_std": float(rv.std()) if rv.numel() > 1 else 0.0,
        "train/reward_valid_frac": float(ok.mean()),
        "train/zero_std_frac": float(1 - group_has_signal.mean()),
        "train/adv_mean": float(advantages[valid].mean()) if rv.numel() else 0.0,
        "train/adv_std": float(advantages[valid].std()) if rv.numel() > 1 else 0.0,
        "train/adv_abs_max": float(advantages.abs().max()),
        "rollout/len_mean": float(lengths.mean()),
        "rollout/len_max": float(lengths.max()),
        "rollout/len_min": float(lengths.min()),
        "rollout/truncated_frac": float(completions.truncated.float().mean()),
    }


def length_by_correctness(completions: Completions, rewards: torch.Tensor) -> dict[str, float]:
    """Mean completion length of rewarded (> 0) and unrewarded completions (Dr. GRPO's length bias)."""
    lengths = completions.lengths.float().cpu()
    flat = rewards.reshape(-1)
    out = {}
    for name, sel in (("correct", flat > 0), ("wrong", flat <= 0)):
        if sel.any():
            out[f"rollout/len_{name}"] = float(lengths[sel].mean())
    return out
