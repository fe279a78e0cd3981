"""TRL GRPOConfig names a TRL user may write as grpolab config keys, and the grpolab key that does the job:
the unknown-key error names it instead of a look-alike (``algo.epsilon`` is not ``algo.eps``)."""

from __future__ import annotations

TRL_NAMES: dict[str, str] = {
    "epsilon": "TRL's epsilon is the ratio clip: algo.clip_low (epsilon_high: algo.clip_high); algo.eps is the "
    "small number added to the reward std",
    "epsilon_high": "algo.clip_high (DAPO's Clip-Higher: 0.28)",
    "delta": "algo.dual_clip (TRL's two-sided clip delta, for delta > 1 + epsilon_high)",
    "max_steps": "train.num_steps (one step = one generation batch; TRL counts optimizer steps)",
    "num_train_epochs": "train.num_steps (grpolab counts generation batches, not epochs)",
    "learning_rate": "optim.lr",
    "lr_scheduler_type": "optim.schedule (constant, linear, cosine)",
    "warmup_steps": "optim.warmup_steps",
    "warmup_ratio": "optim.warmup_steps (in optimizer steps)",
    "weight_decay": "optim.weight_decay",
    "adam_beta1": "optim.betas: [beta1, beta2]",
    "adam_beta2": "optim.betas: [beta1, beta2]",
    "max_grad_norm": "optim.max_grad_norm",
    "num_iterations": "algo.mu (passes over each generation batch)",
    "loss_type": "algo.loss_agg (grpo: seq-mean-token-mean, dapo: token-mean, dr_grpo: seq-mean-token-sum-norm)",
    "scale_rewards": "algo.advantage (group: grpo, none: dr_grpo)",
    "num_generations": "rollout.num_generations",
    "max_completion_length": "rollout.max_completion_length",
    "temperature": "rollout.temperature",
    "top_p": "rollout.top_p",
    "top_k": "rollout.top_k",
    "per_device_train_batch_size": "train.prompts_per_step (prompts per generation batch) and train.micro_batch_size",
    "generation_batch_size": "train.prompts_per_step x rollout.num_generations completions",
    "gradient_accumulation_steps": "train.micro_batch_size (grpolab accumulates micro-batches up to each minibatch)",
    "steps_per_generation": "algo.num_minibatches (optimizer steps per generation batch)",
    "mask_truncated_completions": "algo.mask_truncated",
    "importance_sampling_level": "algo.importance_level",
    "sync_ref_model": "algo.ref_reset_every",
    "ref_model_sync_steps": "algo.ref_reset_every",
    "entropy_coef": "algo.entropy_coef",
    "reward_weights": "reward.functions[i].weight",
    "reward_funcs": "reward.functions",
    "save_steps": "log.checkpoint_every",
    "save_total_limit": "log.keep_last",
    "logging_steps": "log.samples_every (grpolab logs metrics every step)",
    "log_completions": "log.samples_every",
    "bf16": "model.autocast=bf16",
    "model_name_or_path": "model.name_or_path",
    "dataset_name": "data.path (with data.source=hf)",
    "gradient_checkpointing": "model.gradient_checkpointing",
    "output_dir": "log.output_dir (the run folder is log.output_dir/log.run_name)",
    "run_name": "log.run_name",
    "report_to": "log.report_to",
    "seed": "seed (top level)",
}


def trl_hint(key: str) -> str | None:
    """'; TRL's <key> is grpolab's ...' for an unknown key that is a TRL name, else None."""
    hint = TRL_NAMES.get(key)
    if hint is None:
        return None
    return f"; {hint}" if hint.startswith("TRL's") else f"; TRL's {key} is grpolab's {hint}"
