"""From sampled completions and their rewards to a RolloutBatch: advantages, reference and old log-probs."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from grpolab.algo.advantages import OUTCOME_ESTIMATORS
from grpolab.algo.gdpo import COMPONENT_ESTIMATORS
from grpolab.algo.masked import masked_mean
from grpolab.algo.reinforce import TOKEN_ESTIMATORS
from grpolab.distributed import dist
from grpolab.models.loading import Reference
from grpolab.training.reasoning_steps import StepRewards
from grpolab.training.spec import BatchSpec, LogprobContext
from grpolab.types import Completions, RolloutBatch

AdvantageFn = Callable[..., torch.Tensor]
"""``(rewards [P, G], valid [P, G], mask [N, T], token_kl [N, T] | None, *, parts: RewardParts | None) ->
advantages [N, T]``; only GDPO reads ``parts``."""


@dataclass(frozen=True)
class RewardParts:
    """Each reward function's rewards apart, for GDPO (grpolab.algo.gdpo)."""

    values: torch.Tensor
    """[P, G, K] unweighted values, 0 where a function does not apply."""
    valid: torch.Tensor
    """[P, G, K] bool, False where a function returned None."""
    weights: torch.Tensor
    """[K] the functions' weights."""


def reward_parts(components: Mapping[str, Sequence[float | None]], weights: Mapping[str, float], shape) -> RewardParts:
    """The [P, G, K] parts of a step's ``ScoreResult.components`` (name -> [N] values), in its order;
    ``weights``: name -> weight (the run's reward functions); ``shape``: (P, G)."""
    names = list(components)
    valid = torch.tensor([[v is not None for v in components[n]] for n in names], dtype=torch.bool)
    values = torch.tensor([[0.0 if v is None else float(v) for v in components[n]] for n in names])
    k = len(names)
    return RewardParts(
        values=values.T.reshape(*shape, k),
        valid=valid.T.reshape(*shape, k),
        weights=torch.tensor([float(weights[n]) for n in names]),
    )


BatchBuilder = Callable[..., tuple[RolloutBatch, dict[str, float]]]
"""``(completions, prompt_ids, rewards, valid, *, policy, reference, parts=None, steps=None) -> (batch, metrics)``:
the outcome-advantage builder below, or PPO's with its critic (training/ppo.py), with its BatchSpec bound; chosen
once at assembly."""


def outcome_estimator(advantage: str, *, std, eps: float, beta: float, gamma: float) -> AdvantageFn:
    """The advantage function of ``advantage`` (algo.advantage; ``std``, ``eps``, ``beta``, ``gamma`` the algo
    section's), chosen once: an OUTCOME_ESTIMATORS entry ([P, G], one value along T) or a TOKEN_ESTIMATORS
    entry (REINFORCE++: [N, T]). Batch-level statistics span every rank under torchrun."""
    if advantage in COMPONENT_ESTIMATORS:  # GDPO: each function apart, then the whole batch (all ranks)
        per_parts = functools.partial(COMPONENT_ESTIMATORS[advantage], std=std, eps=eps)
        return functools.partial(_from_parts, _over_all_ranks(per_parts))
    if advantage in TOKEN_ESTIMATORS:  # whitened over the batch's tokens: all ranks' tokens
        return _tokens_over_all_ranks(functools.partial(TOKEN_ESTIMATORS[advantage], beta=beta, gamma=gamma))
    if advantage not in OUTCOME_ESTIMATORS:
        known = sorted([*OUTCOME_ESTIMATORS, *TOKEN_ESTIMATORS])
        raise ValueError(f"algo.advantage '{advantage}' is not a GRPO-path estimator; known: {known}")
    per_group = functools.partial(OUTCOME_ESTIMATORS[advantage], std=std, eps=eps)
    if advantage in _BATCH_LEVEL:
        per_group = _over_all_ranks(per_group)
    return functools.partial(_per_completion, per_group, beta=beta)


def _per_completion(estimator, rewards, valid, mask, token_kl, *, beta: float, parts=None) -> torch.Tensor:
    """One advantage per completion, repeated along T. With ``token_kl`` (algo.kl_in=reward), RLOO's
    shaping (arXiv 2402.14740): r_i - beta * sum_t kl_t on the sequence reward, before the baseline."""
    if token_kl is not None:
        rewards = rewards - beta * (token_kl * mask).sum(-1).view_as(rewards).cpu()
    advantages = estimator(rewards, valid)  # [P, G]
    return advantages.reshape(-1, 1).to(mask.device).expand_as(mask).float() * mask


def _from_parts(estimator, rewards, valid, mask, token_kl, *, parts: RewardParts | None = None) -> torch.Tensor:
    """GDPO's advantage per completion, repeated along T (the KL is in the loss: config/checks.py)."""
    if parts is None:
        raise ValueError("algo.advantage=gdpo reads each reward function's values: pass parts (reward_parts)")
    advantages = estimator(parts.values, parts.valid, parts.weights)  # [P, G]
    return advantages.reshape(-1, 1).to(mask.device).expand_as(mask).float() * mask


_BATCH_LEVEL = {"batch_std", "batch_reward_std"}
"""Outcome estimators whose statistics span the whole batch: under torchrun they see every rank's groups."""


def _over_all_ranks(fn):
    """``fn`` on the rewards of all ranks (gathered, in rank order), then this rank's rows of the result."""

    def run(rewards: torch.Tensor, valid: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        return dist.local_rows(fn(dist.gather_rows(rewards), dist.gather_rows(valid), *rest))

    return run


def _tokens_over_all_ranks(fn):
    """A token estimator on every rank's rows ([N, T] padded to the widest rank's T), then this rank's."""

    def run(rewards, valid, mask, token_kl, parts=None) -> torch.Tensor:
        t = mask.shape[1]
        width = int(dist.all_reduce_max(float(t)))

        def wide(x: torch.Tensor) -> torch.Tensor:
            return dist.gather_rows(torch.cat([x, x.new_zeros((x.shape[0], width - t))], dim=1))

        kl = None if token_kl is None else wide(token_kl)
        out = fn(dist.gather_rows(rewards), dist.gather_rows(valid), wide(mask), kl)
        return dist.local_rows(out)[:, :t]

    return run


def rewards_tensor(total: Sequence[float | None], num_prompts: int, num_generations: int):
    """(rewards [P, G] with 0 where not applicable, valid [P, G] bool)."""
    valid = torch.tensor([r is not None for r in total], dtype=torch.bool).view(num_prompts, num_generations)
    values = torch.tensor([0.0 if r is None else float(r) for r in total], dtype=torch.float32)
    return values.view(num_prompts, num_generations), valid


def repeated_prompts(prompt_ids: Sequence[Sequence[int]], num_generations: int) -> list[list[int]]:
    """[N] prompt ids: each of the [P] prompts repeated G times, prompt-major, to match the completions."""
    return [list(p) for p in prompt_ids for _ in range(num_generations)]


def reference_logprobs(
    reference: Reference | None, ctx: LogprobContext, ids: list[list[int]], completions: Completions
) -> torch.Tensor | None:
    """[N, T] log-probs of the completions under the reference (None without one: algo.beta = 0)."""
    if reference is None:
        return None
    with reference.model() as ref_model:
        return ctx.logprobs(ref_model, ids, completions.completion_ids, completions.completion_mask)


def old_logprobs_if_needed(
    spec: BatchSpec, policy: torch.nn.Module, ids: list[list[int]], completions: Completions
) -> torch.Tensor | None:
    """[N, T] log-probs under the policy before its first update, when it moves within the batch
    (``spec.recompute_old_logprobs``: several epochs or minibatches); else None, the ratio being exactly 1."""
    if not spec.recompute_old_logprobs:
        return None
    return spec.logprobs.logprobs(policy, ids, completions.completion_ids, completions.completion_mask)


def build_rollout_batch(
    spec: BatchSpec,
    completions: Completions,
    prompt_ids: Sequence[Sequence[int]],
    rewards: torch.Tensor,
    valid: torch.Tensor,
    *,
    estimator: AdvantageFn,
    policy: torch.nn.Module,
    reference: Reference | None,
    steps: StepRewards | None = None,
    parts: RewardParts | None = None,
) -> tuple[RolloutBatch, dict[str, float]]:
    """Advantages, reference log-probs and, when needed, old log-probs.

    prompt_ids is [P]; each prompt is repeated G times, prompt-major, to match completions.
    Outcome supervision: ``estimator`` on the rewards [P, G], one value along T. Process supervision
    (``steps`` given): ``grpo_process_advantages`` on the step rewards, [N, T]; the logged [P, G]
    advantages are then each completion's first-token advantage. ``parts``: each reward function's rewards
    apart (``reward_parts``), which GDPO reads instead of the sum.
    """
    g = completions.num_generations
    ids = repeated_prompts(prompt_ids, g)
    device = completions.completion_ids.device
    mask = completions.completion_mask  # the sequence the trainer runs (a multi-turn episode: env tokens too)
    trains = completions.model_mask  # the tokens the model sampled: only they get loss, KL and advantage
    loss_mask = trains & ~completions.truncated.to(device)[:, None] if spec.mask_truncated else trains
    ref_logprobs = reference_logprobs(reference, spec.logprobs, ids, completions)
    sampler_logprobs = completions.logprobs.to(device)
    token_kl = None
    if spec.kl_in_reward and ref_logprobs is not None:
        # algo.kl_estimator per token (k1 = log(pi/pi_ref) in the presets), with the sampling log-probs as pi
        # (no grad): summed into the sequence reward (RLOO) or into every token's reward (REINFORCE++).
        kl = spec.kl(sampler_logprobs, ref_logprobs)
        token_kl = torch.where(trains, kl, torch.zeros_like(ref_logprobs))
    if steps is None:
        adv_tokens = estimator(rewards, valid, trains, token_kl, parts=parts)  # [N, T]
        advantages = masked_mean(adv_tokens, trains, dim=-1).view_as(rewards).cpu()  # [P, G], for metrics
    else:
        adv_tokens = spec.process_advantages(steps.step_rewards, steps.step_end_mask, trains, num_generations=g)  # env tokens get none
        advantages = adv_tokens[:, 0].reshape_as(rewards).cpu()
    old_logprobs = old_logprobs_if_needed(spec, policy, ids, completions)
    batch = RolloutBatch(
        prompt_ids=ids,
        completion_ids=completions.completion_ids,
        completion_mask=mask,
        loss_mask=loss_mask,
        advantages=adv_tokens,
        old_logprobs=old_logprobs,
        ref_logprobs=ref_logprobs,
        sampler_logprobs=sampler_logprobs,
    )
    metrics = rollout_metrics(completions, rewards, valid, advantages)
    return batch, metrics if steps is None else {**metrics, **steps.metrics}


def rollout_metrics(
    completions: Completions, rewards: torch.Tensor, valid: torch.Tensor, advantages: torch.Tensor
) -> dict[str, float]:
    """The step's reward and completion statistics, under TRL GRPOTrainer's names where TRL logs the same
    quantity (``reward``, ``completions/mean_length``, ...: README "Metrics"); grpolab's own keep a prefix."""
    lengths = completions.lengths.float()
    ok = valid.float()
    group_has_signal = torch.tensor(
        [len(set(r[v].tolist())) > 1 for r, v in zip(rewards, valid, strict=True)], dtype=torch.float32
    )
    rv = rewards[valid]
    terminated = lengths[~completions.truncated.to(lengths.device)]
    if terminated.numel() == 0:  # as TRL: 0 when every completion was cut
        terminated = torch.zeros(1)
    return {
        "reward": float(rv.mean()) if rv.numel() else math.nan,
        "reward_std": float(rv.std()) if rv.numel() > 1 else 0.0,
        "frac_reward_zero_std": float(1 - group_has_signal.mean()),
        "train/reward_valid_frac": float(ok.mean()),
        "train/adv_mean": float(advantages[valid].mean()) if rv.numel() else 0.0,
        "train/adv_std": float(advantages[valid].std()) if rv.numel() > 1 else 0.0,
        "train/adv_abs_max": float(advantages.abs().max()),
        "completions/mean_length": float(lengths.mean()),
        "completions/min_length": float(lengths.min()),
        "completions/max_length": float(lengths.max()),
        "completions/clipped_ratio": float(completions.truncated.float().mean()),
        "completions/mean_terminated_length": float(terminated.mean()),
        "completions/min_terminated_length": float(terminated.min()),
        "completions/max_terminated_length": float(terminated.max()),
        **episode_metrics(completions),
    }


def episode_metrics(completions: Completions) -> dict[str, float]:
    """Multi-turn episodes: model turns per episode (verl's num_turns), tool calls per episode and the share
    of them that failed (TRL's tools/call_frequency, tools/failure_frequency), and the share of the
    episode's tokens that the model sampled (the rest are environment context)."""
    if completions.episodes is None:
        return {}
    eps = completions.episodes
    turns = torch.tensor([float(e.turns) for e in eps])
    calls = sum(e.tool_calls for e in eps)
    sampled = float(completions.model_mask.sum()) / max(float(completions.completion_mask.sum()), 1.0)
    return {
        "num_turns/mean": float(turns.mean()),
        "num_turns/max": float(turns.max()),
        "tools/call_frequency": calls / len(eps),
        "tools/failure_frequency": sum(e.tool_errors for e in eps) / calls if calls else 0.0,
        "rollout/model_token_frac": sampled,
    }


def step_tokens(completions: Completions) -> int:
    """Prompt + completion tokens of the step's N sequences (TRL's ``num_tokens`` adds them up over the run)."""
    return sum(len(p) for p in completions.prompt_ids) + int(completions.lengths.sum())


def length_by_reward(completions: Completions, rewards: torch.Tensor, valid: torch.Tensor) -> dict[str, float]:
    """Mean length of completions rewarded above and below their group's mean (Dr. GRPO's length bias).

    Above the mean is a positive group-relative advantage, whatever the reward's scale (a fixed threshold
    such as "reward > 0.5" means something only for 0/1 rewards). Ties with the mean, groups whose
    rewards are all equal and invalid rewards count in neither; a key is absent when no completion counts.
    """
    lengths = completions.lengths.float().cpu().view_as(rewards)  # [P, G]
    valid = valid.cpu()
    counts = valid.sum(-1, keepdim=True).clamp(min=1)
    group_mean = torch.where(valid, rewards, torch.zeros_like(rewards)).sum(-1, keepdim=True) / counts
    highest = torch.where(valid, rewards, torch.full_like(rewards, -math.inf)).amax(-1, keepdim=True)
    lowest = torch.where(valid, rewards, torch.full_like(rewards, math.inf)).amin(-1, keepdim=True)
    counted = valid & (highest > lowest)  # a rounded mean of equal rewards must not split them
    out = {}
    for name, sel in (("above", counted & (rewards > group_mean)), ("below", counted & (rewards < group_mean))):
        if sel.any():
            out[f"rollout/len_{name}_group_mean"] = float(lengths[sel].mean())
    return out
