"""The config read, once, into what a step needs (training/spec.py): the one place a step's settings are chosen,
and the optimizers and PPO's value model built from their sections.

A loss setting goes from the preset or the user's YAML to the config's section, and from there here, where
it becomes a bound function (``algo.loss_agg`` an ``Aggregation``, ``algo.policy_loss`` a surrogate with its
coefficients); the step calls what it is given.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence

import torch

from grpolab.algo.advantages import grpo_process_advantages
from grpolab.algo.correction import rollout_correction_weights
from grpolab.algo.entropy_control import AdaptiveEntropy
from grpolab.algo.kl import KL_ESTIMATORS
from grpolab.algo.losses import POLICY_LOSSES, Aggregation
from grpolab.config import Config, OptimConfig
from grpolab.distributed import dist, parallel
from grpolab.rewards.step_rewards import build_process_reward
from grpolab.training.batch import BatchBuilder, outcome_estimator
from grpolab.training.optim import build_optimizer
from grpolab.training.ppo import Critic, rollout_batch_builder
from grpolab.training.reasoning_steps import ProcessSupervision, StepSplitter, TurnSupervision
from grpolab.training.spec import (
    BatchSpec,
    CriticSpec,
    LogprobContext,
    PolicyLossSpec,
    SamplingSpec,
    UpdateSpec,
    ValueModelSpec,
)  # fmt: skip
from grpolab.training.value import load_value_model
from grpolab.types import Example

log = logging.getLogger(__name__)

__all__ = [
    "batch_builder", "batch_spec", "build_critic", "critic_optim", "critic_spec", "entropy_control", "logprob_context",
    "policy_loss_spec", "process_supervision", "run_optimizer", "sampling_spec", "update_spec", "value_model_spec",
]  # fmt: skip


def sampling_spec(cfg: Config) -> SamplingSpec:
    """How each step's groups are drawn and scored: the prompts and G, DAPO's rounds, the failed-group stop,
    the reward calls' bounds."""
    return SamplingSpec(
        prompts_per_step=cfg.train.prompts_per_step,
        num_generations=cfg.rollout.num_generations,
        dynamic_sampling=bool(cfg.algo.dynamic_sampling),  # null: the preset's, resolved at load
        max_sampling_rounds=cfg.algo.max_sampling_rounds,
        max_failed_group_share=cfg.train.max_failed_group_share,
        reward_timeout_s=cfg.reward.timeout_s,
        reward_max_retries=cfg.reward.max_retries,
    )


def run_optimizer(cfg: Config, model: torch.nn.Module, optim: OptimConfig | None = None):
    """(optimizer, scheduler) of ``model``: AdamW with ``optim`` (default cfg.optim), its schedule over the run's
    optimizer steps."""
    total = cfg.train.num_steps * cfg.optimizer_steps_per_generation
    return build_optimizer(model, cfg.optim if optim is None else optim, total_steps=total)


def critic_optim(cfg: Config) -> OptimConfig:
    """PPO's value model's optim section: the policy's, at algo.value_lr (else optim.lr)."""
    return dataclasses.replace(cfg.optim, lr=cfg.algo.value_lr or cfg.optim.lr)


def value_model_spec(cfg: Config) -> ValueModelSpec:
    """Where PPO's value model comes from (algo.value_init) and how it runs, as the policy does."""
    a = cfg.algo
    return ValueModelSpec(
        model=cfg.model, init=a.value_init, init_path=a.value_init_path, sequence_parallel=cfg.train.sequence_parallel,
        longest_sequence=cfg.longest_sequence,
    )  # fmt: skip


def logprob_context(cfg: Config, *, pad_id: int, autocast_dtype: torch.dtype | None, device_type: str) -> LogprobContext:
    """The forwards' settings: ``pad_id`` the tokenizer's, ``autocast_dtype`` model.autocast resolved for the
    device, micro-batches sized for ``device_type`` ("cpu", "cuda")."""
    t = cfg.train
    return LogprobContext(
        pad_id=pad_id,
        temperature=cfg.rollout.temperature,
        autocast_dtype=autocast_dtype,
        micro_batch_size=t.micro_batch_rows(device_type),
        max_tokens=t.max_tokens_per_micro_batch,
        padding_free=t.padding_free,
    )


def policy_loss_spec(cfg: Config) -> PolicyLossSpec:
    """The policy loss of ``cfg.algo``, every choice bound."""
    a = cfg.algo
    correction = None
    if a.rollout_correction != "none":
        correction = functools.partial(
            rollout_correction_weights, mode=a.rollout_correction, level=a.rollout_correction_level, cap=a.rollout_correction_cap
        )
    own: dict[str, float] = {}
    if a.policy_loss == "sapo":
        own = {"temperature_pos": a.sapo_temperature_pos, "temperature_neg": a.sapo_temperature_neg}
    elif a.policy_loss == "vespo":
        own = {"k_pos": a.vespo_k_pos, "lambda_pos": a.vespo_lambda_pos, "k_neg": a.vespo_k_neg, "lambda_neg": a.vespo_lambda_neg}
    surrogate = functools.partial(
        POLICY_LOSSES[a.policy_loss], clip_low=a.clip_low, clip_high=a.clip_high, dual_clip=a.dual_clip,
        level=a.importance_level, **own,
    )  # fmt: skip
    # Dr. GRPO's constant: the longest a completion can be (an episode: its token budget)
    norm_len = cfg.env.max_episode_tokens if cfg.env.name is not None else cfg.rollout.max_completion_length
    return PolicyLossSpec(
        surrogate=surrogate,
        aggregate=Aggregation.named(
            a.loss_agg, norm_len=norm_len, batch_rows=a.loss_agg_batch_rows if a.loss_agg == "batch-token-mean" else None
        ),
        kl=KL_ESTIMATORS[a.kl_estimator] if a.kl_in == "loss" and a.beta > 0 else None,
        beta=a.beta,
        correction=correction,
        correction_in_loss=a.policy_loss == "vespo",
        entropy_coef=a.entropy_coef,
        entropy_adaptive=a.entropy_adaptive,
        off_policy_threshold=a.off_policy_mask_threshold,
        top_entropy_quantile=a.top_entropy_quantile,
    )


def entropy_control(cfg: Config) -> AdaptiveEntropy | None:
    """algo.entropy_adaptive's controller, at its starting coefficient (a resumed run loads its state), or None."""
    a = cfg.algo
    if not a.entropy_adaptive:
        return None
    return AdaptiveEntropy(
        coef=a.entropy_coef, target=a.entropy_target, delta=a.entropy_coef_delta, coef_min=a.entropy_coef_min,
        coef_max=a.entropy_coef_max,
    )


def update_spec(cfg: Config, logprobs: LogprobContext) -> UpdateSpec:
    """The policy update of ``cfg``, its forwards as ``logprobs`` computes them."""
    return UpdateSpec(
        loss=policy_loss_spec(cfg),
        logprobs=logprobs,
        mu=cfg.algo.mu,
        num_minibatches=cfg.algo.num_minibatches,
        max_grad_norm=cfg.optim.max_grad_norm,
        offload_activations=cfg.train.offload_activations,
    )


def batch_spec(cfg: Config, logprobs: LogprobContext) -> BatchSpec:
    """How the step's samples become a batch: the KL's place and estimator, the masks, PPO's GAE."""
    a = cfg.algo
    return BatchSpec(
        logprobs=logprobs,
        kl=KL_ESTIMATORS[a.kl_estimator],
        process_advantages=functools.partial(grpo_process_advantages, std=a.std, eps=a.eps),
        kl_in_reward=a.kl_in == "reward",
        beta=a.beta,
        mask_truncated=a.mask_truncated,
        recompute_old_logprobs=a.needs_old_logprobs,
        gamma=a.gamma,
        lam=a.lam,
        whiten_advantages=a.whiten_advantages,
    )


def batch_builder(cfg: Config, logprobs: LogprobContext, critic: Critic | None) -> BatchBuilder:
    """The step's batch builder: PPO's GAE with ``critic``, else algo.advantage's estimator."""
    a = cfg.algo
    estimator = None if critic is not None else outcome_estimator(a.advantage, std=a.std, eps=a.eps, beta=a.beta, gamma=a.gamma)
    return rollout_batch_builder(batch_spec(cfg, logprobs), critic, estimator)


def critic_spec(cfg: Config, logprobs: LogprobContext) -> CriticSpec:
    """PPO's value update: the policy's passes and minibatches, its own clip and coefficient."""
    a = cfg.algo
    return CriticSpec(
        logprobs=logprobs, mu=a.mu, num_minibatches=a.num_minibatches, value_clip=a.value_clip, vf_coef=a.vf_coef,
        warmup_steps=a.critic_warmup_steps, max_grad_norm=cfg.optim.max_grad_norm,
    )  # fmt: skip


def build_critic(cfg: Config, device: torch.device, logprobs: LogprobContext) -> Critic:
    """PPO's value model (algo.value_init), wrapped as the policy is, with its AdamW at algo.value_lr (else
    optim.lr) and its own minibatch shuffle (seed + 2)."""
    mode = parallel.resolve_parallel(cfg.train.parallel, dist.world().size)
    spec = value_model_spec(cfg)
    if not parallel.loads_on_rank0(mode):
        model = parallel.wrap(load_value_model(spec, device), mode, device)
    else:  # FSDP2: no GPU holds the whole critic (rank 0 on the host, the others on meta, then broadcast)
        plain = load_value_model(spec, device, placement="host" if dist.is_main() else "meta")
        full = plain.state_dict() if dist.is_main() else {}
        model = parallel.wrap(plain, mode, device)
        parallel.materialize_from_rank0(model, full, device)
    optimizer, scheduler = run_optimizer(cfg, model, critic_optim(cfg))
    return Critic(model, critic_spec(cfg, logprobs), optimizer, scheduler, torch.Generator().manual_seed(cfg.seed + 2))


def process_supervision(
    cfg: Config, tokenizer, examples: Sequence[Example]
) -> ProcessSupervision | TurnSupervision | None:
    """The process scorer for algo.supervision=process (dry-run on a few examples), else None. With an
    environment the steps are the episode's turns (``TurnSupervision``)."""
    if cfg.algo.supervision != "process":
        return None
    if cfg.env.name is not None:
        weight = sum(f.weight for f in cfg.reward.functions if f.name == "env")
        log.info("process supervision: the steps are the episode's turns (env reward weight %g)", weight)
        return TurnSupervision(weight)
    spec = cfg.reward.process
    splitter = StepSplitter(tokenizer, spec.delimiter)
    process = ProcessSupervision(
        splitter, build_process_reward(spec.name, spec.kwargs), timeout_s=cfg.reward.timeout_s
    )
    process.dry_run(list(examples[: cfg.reward.dry_run_examples]))
    log.info("process supervision: reward '%s', steps end at %r", process.reward.name, spec.delimiter)
    return process
