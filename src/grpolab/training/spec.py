"""What one step needs besides the batch and the models: frozen, typed, built once at assembly.

runtime/step_spec.py reads the config into these; nothing in training/ reads the config. ``SamplingSpec`` is
how a step's groups are drawn and scored, ``ValueModelSpec`` where PPO's value model comes from; the rest
are the update's. The temperature, pad id, autocast dtype and micro-batch size travel in ``LogprobContext`` alone: the reference
and old log-probs, PPO's values and the update's forwards all read them from there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from grpolab.algo.losses import Aggregation, SurrogateLoss
from grpolab.config import ModelConfig
from grpolab.training.logprobs import completion_logprobs
from grpolab.training.microbatch import prompt_lengths_of, split_rows
from grpolab.training.packing import packed_completion_logprobs
from grpolab.types import RolloutBatch


@dataclass(frozen=True)
class SamplingSpec:
    """How one step's groups are drawn, sampled and scored (training/sampling.py ``sample_step``)."""

    prompts_per_step: int
    """train.prompts_per_step: the prompts of one round over every rank (each rank draws its share)."""
    num_generations: int
    """rollout.num_generations: G, the completions of each prompt."""
    dynamic_sampling: bool = False
    """algo.dynamic_sampling (the preset's when null): DAPO's rounds, keeping only the groups with a signal."""
    max_sampling_rounds: int = 10
    """algo.max_sampling_rounds: the most rounds of one step with dynamic sampling (without it, one round)."""
    max_failed_group_share: float = 0.5
    """train.max_failed_group_share: more failed groups than this share of the step stop the run."""
    reward_timeout_s: float = 60.0
    """reward.timeout_s: the bound of one reward call (rewards/isolate.py ``score_groups``)."""
    reward_max_retries: int = 1
    """reward.max_retries: a group whose reward call failed is scored again this many times."""


@dataclass(frozen=True)
class ValueModelSpec:
    """Where PPO's value model comes from and how it runs (training/value.py ``load_value_model``)."""

    model: ModelConfig
    """The policy's model section: its checkpoint (the body under value_init=policy), dtype, revision,
    attention and gradient checkpointing."""
    init: Literal["policy", "reward_model"] = "policy"
    """algo.value_init: the body from the policy's checkpoint and a zero head, or a reward model's body and head."""
    init_path: str | None = None
    """algo.value_init_path: the reward model's folder or hub id (value_init=reward_model)."""
    sequence_parallel: int = 1
    """train.sequence_parallel: ranks that split each sequence (models/ulysses_attention.py)."""
    longest_sequence: int = 0
    """The longest prompt + completion in tokens (Config.longest_sequence): model.gradient_checkpointing=auto
    turns it on past a length."""


@dataclass(frozen=True)
class LogprobContext:
    """How a batch's log-probs are computed: the same for the reference, the old policy and the update."""

    pad_id: int
    """The tokenizer's pad id: fills the left-padded prompts (masked out of attention)."""
    temperature: float
    """rollout.temperature: the logits are divided by it, so the log-probs are those of the sampled distribution."""
    autocast_dtype: torch.dtype | None
    """The autocast dtype of the forwards (model.autocast resolved for the device), None for full precision."""
    micro_batch_size: int
    """Rows per forward (train.micro_batch_size resolved for the device: "auto" is 64 on a CPU, 8 on CUDA)."""
    max_tokens: int | None = None
    """train.max_tokens_per_micro_batch: padded tokens per forward (None = rows only)."""
    padding_free: bool = False
    """train.padding_free: the update's forwards pack a micro-batch's rows into one sequence (training/packing.py);
    the no-grad log-probs of ``logprobs`` stay padded."""

    @torch.no_grad()
    def logprobs(self, model, prompt_ids, completion_ids, completion_mask) -> torch.Tensor:
        """[N, T] log-probs without a graph, in micro-batches."""

        def run(prompts, ids, mask):
            return completion_logprobs(
                model, prompts, ids, mask, pad_id=self.pad_id, temperature=self.temperature, autocast_dtype=self.autocast_dtype
            )[0]

        return self.map_rows(run, prompt_ids, completion_ids, completion_mask)

    def forward(
        self, model, mb: RolloutBatch, *, entropy_grad: bool = False, into_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log-probs [n, T], entropy [n, T]) of a micro-batch for the update: with the graph when called outside
        no_grad, packed with ``padding_free`` (training/logprobs.py ``completion_logprobs`` for the arguments)."""
        fn = packed_completion_logprobs if self.padding_free else completion_logprobs
        return fn(
            model, mb.prompt_ids, mb.completion_ids, mb.completion_mask, pad_id=self.pad_id, temperature=self.temperature,
            autocast_dtype=self.autocast_dtype, with_entropy=True, entropy_grad=entropy_grad, into_grad=into_grad,
        )  # fmt: skip

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


@dataclass(frozen=True)
class PolicyLossSpec:
    """The policy loss with every choice bound: functions to call, no names to look up in the step."""

    surrogate: Callable[..., SurrogateLoss]
    """``(logprobs, old_logprobs, advantages, *, mask[, is_weights]) -> SurrogateLoss``: a POLICY_LOSSES entry
    (algo.policy_loss) with its clip range, dual clip, importance level and own coefficients bound."""
    aggregate: Aggregation
    """The per-token loss to a scalar (algo.loss_agg, with Dr. GRPO's constant length bound)."""
    kl: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    """``(logprobs, ref_logprobs) -> [N, T]``: the KL estimator in the loss (algo.kl_estimator), or None when the
    KL is not in the loss (algo.kl_in=reward, or beta 0)."""
    beta: float = 0.0
    """algo.beta: the KL term's coefficient."""
    correction: Callable[..., torch.Tensor] | None = None
    """(old_logprobs, sampler_logprobs, mask) -> [N, T] weights (algo.rollout_correction), or None."""
    correction_in_loss: bool = False
    """VESPO: the rollout-correction weights enter its sequence weight (``is_weights``), as TRL, instead of
    multiplying the per-token loss."""
    entropy_coef: float = 0.0
    """algo.entropy_coef: the entropy bonus's coefficient (0: none, and no entropy gradient); under adaptive
    control, the controller's for the optimizer step (training/step.py ``update_policy``)."""
    entropy_adaptive: bool = False
    """algo.entropy_adaptive: the bonus is on even while its coefficient is 0 (``policy_loss`` is logged)."""
    off_policy_threshold: float | None = None
    """algo.off_policy_mask_threshold: DeepSeek-V3.2's off-policy sequence mask, or None."""
    top_entropy_quantile: float = 1.0
    """algo.top_entropy_quantile: below 1, only the minibatch's highest-entropy tokens get policy loss (80/20)."""


@dataclass(frozen=True)
class UpdateSpec:
    """One policy update (training/step.py ``update_policy``): the loss, the forwards and the passes."""

    loss: PolicyLossSpec
    """The policy loss, bound."""
    logprobs: LogprobContext
    """The forwards: temperature, pad id, autocast dtype and micro-batching."""
    mu: int = 1
    """algo.mu: passes over the batch."""
    num_minibatches: int = 1
    """algo.num_minibatches: optimizer steps per pass, each on a seeded shuffle's share of the rows."""
    max_grad_norm: float = 0.0
    """optim.max_grad_norm: the gradient norm is clipped to it (0: measured, not clipped)."""
    offload_activations: bool = False
    """train.offload_activations: the activations saved for backward wait in host memory (training/activations.py)."""


@dataclass(frozen=True)
class BatchSpec:
    """How a step's sampled groups become a RolloutBatch (training/batch.py; PPO's in training/ppo.py)."""

    logprobs: LogprobContext
    """The reference's and the old policy's forwards."""
    kl: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """algo.kl_estimator, ``(logprobs, ref_logprobs) -> [N, T]``: the KL folded into the reward (``kl_in_reward``),
    and PPO's logged ``kl``."""
    process_advantages: Callable[..., torch.Tensor]
    """``(step_rewards, step_end_mask, mask, *, num_generations) -> [N, T]``: process supervision's advantages
    (algo.grpo_process_advantages with algo.std and algo.eps bound)."""
    kl_in_reward: bool = False
    """algo.kl_in=reward: beta x the KL is taken from the reward (RLOO, REINFORCE++, PPO), not added to the loss."""
    beta: float = 0.0
    """algo.beta: the KL's coefficient in the reward (PPO; the outcome estimators have it bound)."""
    mask_truncated: bool = False
    """algo.mask_truncated: a completion cut at the length limit gets no loss."""
    recompute_old_logprobs: bool = False
    """algo.needs_old_logprobs: the policy moves within the batch (mu > 1 or several minibatches), so its
    log-probs at the sampling weights are computed before the first update; else the ratio is exactly 1."""
    gamma: float = 1.0
    """algo.gamma: PPO's GAE discount."""
    lam: float = 1.0
    """algo.lam: PPO's GAE lambda."""
    whiten_advantages: bool = True
    """algo.whiten_advantages: PPO's advantages whitened over every rank's counted tokens."""


@dataclass(frozen=True)
class CriticSpec:
    """PPO's value-model update (training/ppo.py ``Critic``): the same passes and minibatches as the policy's."""

    logprobs: LogprobContext
    """The value forwards' pad id, autocast dtype and micro-batching."""
    mu: int = 1
    """algo.mu: passes over the batch."""
    num_minibatches: int = 1
    """algo.num_minibatches: optimizer steps per pass."""
    value_clip: float | None = 0.2
    """algo.value_clip: the clipped value loss's range around the rollout-time values (None: unclipped)."""
    vf_coef: float = 1.0
    """algo.vf_coef: the value loss's coefficient."""
    warmup_steps: int = 0
    """algo.critic_warmup_steps: the first steps train only the critic."""
    max_grad_norm: float = 0.0
    """optim.max_grad_norm: the value model's gradient norm is clipped to it (0: measured, not clipped)."""
