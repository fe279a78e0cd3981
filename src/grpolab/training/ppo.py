"""PPO with a critic on GRPO's path (DeepSeekMath Sec. 4.1.1, Eqs. 1-2, arXiv 2402.03300; docs/algorithms.md 1.1, 2).

What PPO adds to a GRPO step, and nothing else:
* a value model V_psi (training/value.py) with its own AdamW (``algo.value_lr``), trained with the clipped
  value loss (``algo.value_clip``, ``algo.vf_coef``) over the same mu passes and minibatch split as the
  policy, after the policy update;
* token rewards with the KL penalty folded in: -beta * k1 at every counted token and the score at the last
  one (Eq. 2, ``kl_shaped_token_rewards``), then GAE (``algo.gamma``, ``algo.lam``) on the rollout-time
  values, and masked whitening of the advantages (``algo.whiten_advantages``).
The sampler, rewards, policy loss (Eq. 1, the clipped surrogate), logging and checkpoints are GRPO's.

Departures, and why:
* log pi in the KL penalty is the sampler's log-prob (pi_old), as on the RLOO path and in TRL: the reward
  is fixed when the batch is built; at mu = 1 it equals pi_theta.
* A completion whose reward is "not applicable" (None) gets no loss, policy or value, rather than a score
  of 0 (GRPO gives it advantage 0: no gradient either).
* ``algo.critic_warmup_steps`` trains only the critic for its first steps; the loop skips the policy update.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from grpolab.algo.advantages import gae_advantages, kl_shaped_token_rewards
from grpolab.algo.kl import kl_k1
from grpolab.algo.losses import value_loss
from grpolab.algo.masked import masked_mean, masked_var
from grpolab.distributed import dist, parallel
from grpolab.models.loading import Reference
from grpolab.training.batch import (
    AdvantageFn,
    BatchBuilder,
    build_rollout_batch,
    old_logprobs_if_needed,
    reference_logprobs,
    repeated_prompts,
    rollout_metrics,
)
from grpolab.training.master import backward, grads_to_clip, scale_backed_off
from grpolab.training.microbatch import completion_lengths_of, prompt_lengths_of
from grpolab.training.spec import BatchSpec, CriticSpec
from grpolab.training.step import micro_batches, minibatch_order
from grpolab.training.value import ValueModel, token_values
from grpolab.types import Completions, RolloutBatch

log = logging.getLogger(__name__)


class PPOAdvantages(NamedTuple):
    advantages: Tensor
    """[N, T] GAE advantages (whitened when asked), 0 outside loss_mask."""
    returns: Tensor
    """[N, T] value targets A_t + V(s_t) before whitening, 0 outside the completion mask."""
    token_rewards: Tensor
    """[N, T] -beta * kl (algo.kl_estimator, k1 in the preset) at every counted token, plus the score at the last one."""


def ppo_advantages(
    scores: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor | None,
    values: Tensor,
    mask: Tensor,
    loss_mask: Tensor,
    *,
    beta: float,
    gamma: float,
    lam: float,
    whiten: bool,
    kl: Callable[[Tensor, Tensor], Tensor] = kl_k1,
) -> PPOAdvantages:
    """Scores [N] to the token advantages the PPO loss sees: KL-shaped rewards, GAE, whitening.

    ``mask`` [N, T] is the completion mask (where the episode runs); ``loss_mask`` [N, T] (a subset) is
    what the loss counts, and what the whitening statistics are taken over. ``ref_logprobs=None`` (beta = 0)
    means no KL term. ``kl`` is the per-token KL in the reward (a KL_ESTIMATORS entry, algo.kl_estimator; the paper's k1).
    """
    ref = logprobs if ref_logprobs is None else ref_logprobs
    token_rewards = kl_shaped_token_rewards(scores, logprobs, ref, mask, beta=beta, kl_fn=kl)
    advantages, returns = gae_advantages(token_rewards, values, mask, gamma=gamma, lam=lam)
    if whiten:  # statistics over every rank's tokens (masked_whiten's, made global)
        mean, var = dist.global_masked_mean_var(advantages, loss_mask)
        advantages = (advantages - mean) * torch.rsqrt(var + 1e-8)
    advantages = torch.where(loss_mask, advantages, torch.zeros_like(advantages))
    return PPOAdvantages(advantages, returns, token_rewards)


class Critic:
    """The value model V_psi with its own optimizer: values at rollout time, clipped-value updates."""

    def __init__(self, model: ValueModel, spec: CriticSpec, optimizer, scheduler, generator: torch.Generator):
        """``model`` as it trains (wrapped under torchrun), with its own ``optimizer`` and ``scheduler``;
        ``generator`` shuffles its minibatches (runtime/step_spec.py ``build_critic`` makes them all)."""
        self.model = model
        self.spec = spec
        self.ctx = spec.logprobs
        self.optimizer, self.scheduler = optimizer, scheduler
        self.generator = generator

    def warming_up(self, step: int) -> bool:
        """True while only the critic trains (steps 1 .. algo.critic_warmup_steps)."""
        return step <= self.spec.warmup_steps

    @torch.no_grad()
    def values(self, prompt_ids: Sequence[Sequence[int]], completion_ids: Tensor, completion_mask: Tensor) -> Tensor:
        """[N, T] V(s_t) without a graph, in micro-batches."""
        self.model.eval()
        return self.ctx.map_rows(self._values, prompt_ids, completion_ids, completion_mask)

    def _values(self, prompt_ids, completion_ids, completion_mask) -> Tensor:
        return token_values(
            self.model,
            prompt_ids,
            completion_ids,
            completion_mask,
            pad_id=self.ctx.pad_id,
            autocast_dtype=self.ctx.autocast_dtype,
        )

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """mu passes of clipped-value-loss updates over the batch (token-mean over each minibatch)."""
        t0 = time.perf_counter()
        a = self.spec
        sums: dict[str, float] = defaultdict(float)
        updates = 0
        lengths = completion_lengths_of(batch.completion_mask)
        budget = {"max_tokens": self.ctx.max_tokens, "prompt_lengths": prompt_lengths_of(batch.prompt_ids)}
        self.model.train()
        for _ in range(a.mu):
            for rows in minibatch_order(batch.num_sequences, a.num_minibatches, self.generator):
                total = max(dist.global_token_count(batch.loss_mask[rows]), 1.0)
                self.optimizer.zero_grad(set_to_none=True)
                micros = micro_batches(rows, lengths, self.ctx.micro_batch_size, **budget)  # resolved by device
                for i, micro in enumerate(micros):
                    mb = batch.select(micro)
                    with parallel.gradient_sync(self.model, sync=i == len(micros) - 1):  # DDP: one all-reduce per step
                        values = self._values(mb.prompt_ids, mb.completion_ids, mb.completion_mask)  # forward inside too
                        loss, clip_frac = value_loss(values, mb.old_values, mb.returns, mb.loss_mask, clip=a.value_clip)
                        weight = float(mb.loss_mask.sum()) / total
                        backward(a.vf_coef * weight * dist.grad_scale() * loss, self.optimizer)
                    sums["loss"] += weight * loss.item()
                    sums["clip_frac"] += weight * float(clip_frac)
                sums["grad_norm"] += self._step()
                updates += 1
        grad_norm = sums.pop("grad_norm")  # the same on every rank; loss and clip_frac are per-rank shares
        sums = {**dist.sum_dict(sums), "grad_norm": grad_norm}
        return {
            "loss/value": sums["loss"] / updates,
            "loss/value_clip_frac": sums["clip_frac"] / updates,
            "train/value_grad_norm": sums["grad_norm"] / updates,
            "train/value_lr": self.scheduler.get_last_lr()[0],
            "sys/time_value_update_s": time.perf_counter() - t0,
        }

    def _step(self) -> float:
        params = grads_to_clip(self.model, self.optimizer)  # the fp32 master weights where there are some
        max_norm = self.spec.max_grad_norm
        norm = parallel.clip_grad_norm(params, max_norm if max_norm > 0 else math.inf)
        if not torch.isfinite(norm):
            if scale_backed_off(self.optimizer, True):
                self.optimizer.zero_grad(set_to_none=True)
                return math.nan
            log.warning("non-finite value-model gradient norm (%s): critic update skipped", norm.item())
            self.optimizer.zero_grad(set_to_none=True)
            return math.nan
        self.optimizer.step()
        self.scheduler.step()
        return float(norm)

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])


def build_ppo_batch(
    spec: BatchSpec,
    completions: Completions,
    prompt_ids: Sequence[Sequence[int]],
    rewards: Tensor,
    valid: Tensor,
    *,
    critic: Critic,
    policy: torch.nn.Module,
    reference: Reference | None,
    parts=None,
) -> tuple[RolloutBatch, dict[str, float]]:
    """Reference log-probs, rollout-time values, KL-shaped token rewards, GAE: the PPO RolloutBatch.

    ``rewards`` and ``valid`` are [P, G]; prompt_ids is [P], each repeated G times, prompt-major. ``parts``
    (each reward function apart, for GDPO) is unused: GAE reads the summed reward.
    """
    g = completions.num_generations
    ids = repeated_prompts(prompt_ids, g)
    device = completions.completion_ids.device
    mask = completions.completion_mask
    loss_mask = completions.model_mask & valid.reshape(-1, 1).to(device)  # env tokens: context only
    if spec.mask_truncated:
        loss_mask = loss_mask & ~completions.truncated.to(device)[:, None]
    ref_logprobs = reference_logprobs(reference, spec.logprobs, ids, completions)
    t0 = time.perf_counter()
    old_values = critic.values(ids, completions.completion_ids, mask)
    t_values = time.perf_counter() - t0
    sampled = completions.logprobs.to(device)
    ppo = ppo_advantages(
        rewards.reshape(-1).to(device),
        sampled,
        ref_logprobs,
        old_values,
        mask,
        loss_mask,
        beta=spec.beta if spec.kl_in_reward else 0.0,
        gamma=spec.gamma,
        lam=spec.lam,
        whiten=spec.whiten_advantages,
        kl=spec.kl,
    )
    old_logprobs = old_logprobs_if_needed(spec, policy, ids, completions)
    batch = RolloutBatch(
        prompt_ids=ids,
        completion_ids=completions.completion_ids,
        completion_mask=mask,
        loss_mask=loss_mask,
        advantages=ppo.advantages,
        old_logprobs=old_logprobs,
        ref_logprobs=ref_logprobs,
        old_values=old_values,
        returns=ppo.returns,
        sampler_logprobs=sampled,
    )
    seq_adv = masked_mean(ppo.advantages, loss_mask, dim=-1).view_as(rewards).cpu()
    metrics = rollout_metrics(completions, rewards, valid, seq_adv)
    metrics.update(_value_metrics(old_values, ppo.returns, loss_mask))
    if ref_logprobs is not None:
        metrics["kl"] = dist.global_masked_mean(spec.kl(sampled, ref_logprobs), mask)  # as in the reward
    metrics["sys/time_value_forward_s"] = t_values
    return batch, metrics


def _value_metrics(values: Tensor, returns: Tensor, mask: Tensor) -> dict[str, float]:
    """Mean value and return, and the share of the returns' variance the values explain."""
    var_returns = masked_var(returns, mask)
    explained = 1 - masked_var(returns - values, mask) / var_returns if var_returns > 0 else torch.tensor(math.nan)
    return {
        "train/value_mean": float(masked_mean(values, mask)),
        "train/return_mean": float(masked_mean(returns, mask)),
        "train/value_explained_var": float(explained),
    }


def rollout_batch_builder(spec: BatchSpec, critic: Critic | None, estimator: AdvantageFn) -> BatchBuilder:
    """Chosen once: GAE with the critic (PPO), or ``estimator`` (training/batch.py ``outcome_estimator``: GRPO and
    relatives), ``spec`` bound; called as ``(completions, prompt_ids, rewards, valid, *, policy, reference, ...)``."""
    if critic is not None:
        return functools.partial(build_ppo_batch, spec, critic=critic)
    return functools.partial(build_rollout_batch, spec, estimator=estimator)
