"""The one TRL name table: for each TRL GRPOConfig (or ``trl grpo`` script) name that maps to grpolab keys,
the words naming the grpolab key(s) and how TRL's value becomes them, written once.

Two readers, one entry each:

* the config loader: a TRL name written as a grpolab key (``algo.epsilon``, ``train.max_steps``) is an
  unknown-key error that names grpolab's key (``trl_hint``) instead of a look-alike (``algo.eps``);
* ``grpolab convert-trl`` (grpolab.trl.fields, grpolab.trl.convert): a field it maps with its own rule
  (``named``) takes these words as its description (docs/coming_from_trl.md's table); a field read by
  another field's rule (``read_by``) says so there, and its words here serve the loader only.

The TRL fields convert-trl alone describes (refused, not applicable, mapped to keys no look-alike hides)
keep their words in grpolab.trl.fields; ``grpolab.trl.kinds.worded`` refuses words written for a name of
this table, so none is written twice. Words start with the grpolab key (``TRL's learning_rate is grpolab's
optim.lr``), or with "the " where they say first what TRL's setting is (``TRL's epsilon is the ratio
clip: ...``).
"""

from __future__ import annotations

TRL_NAMES: dict[str, str] = {
    # --- mapped by convert-trl's rule for the name itself (their words are also its table's)
    "per_device_train_batch_size": "train.prompts_per_step = generation_batch_size / num_generations; "
    "algo.num_minibatches = steps_per_generation / gradient_accumulation_steps; algo.mu = num_iterations; "
    "train.micro_batch_size",
    "max_steps": "train.num_steps = max_steps / optimizer steps per generation batch",
    "max_completion_length": "rollout.max_completion_length",
    "temperature": "rollout.temperature (log-probs are scored at it, as TRL)",
    "top_p": "rollout.top_p",
    "top_k": "rollout.top_k (0 = off)",
    "min_p": "rollout.min_p (None = 0.0, off)",
    "repetition_penalty": "rollout.repetition_penalty (1.0 = off)",
    "loss_type": "algo.loss_agg: grpo = seq-mean-token-mean, dr_grpo = seq-mean-token-sum-norm, dapo = "
    "token-mean, cispo = algo.name cispo, sapo = algo.policy_loss sapo, luspo = seq-mean-token-sum, vespo = "
    "algo.policy_loss vespo; bnpo = batch-token-mean with algo.loss_agg_batch_rows = per_device_train_batch_size",
    "scale_rewards": "algo.advantage: group = grpo, batch = batch_reward_std, none = dr_grpo (no std); "
    "multi_objective_aggregation=normalize_then_sum = gdpo",
    "top_entropy_quantile": "algo.top_entropy_quantile (the 80/20 rule, over an optimizer step's tokens)",
    "off_policy_mask_threshold": "algo.off_policy_mask_threshold (DeepSeek-V3.2's off-policy sequence mask)",
    "epsilon": "the ratio clip: algo.clip_low (epsilon_high: algo.clip_high); with loss_type=cispo the weight has "
    "no lower bound; algo.eps is the small number added to the reward std",
    "importance_sampling_level": "algo.importance_level (sequence = GSPO; sequence_token, "
    "trl.experimental.gspo_token's, = sequence); with loss_type=cispo, as TRL, one clipped weight exp(mean "
    "log-ratio) per sequence on each token's log-prob, with TRL's warning that it weights each sequence by its length",
    "mask_truncated_completions": "algo.mask_truncated",
    "sync_ref_model": "algo.ref_reset_every, with ref_model_mixup_alpha as algo.ref_mixup_alpha (TR-DPO)",
    "entropy_coef": "algo.entropy_coef",
    "chat_template_kwargs": "data.chat_template_kwargs (the prompts' and an environment's messages' rendering)",
    "use_adaptive_entropy": "algo.entropy_adaptive, with entropy_target, entropy_coef_delta, _min and _max",
    "cast_lm_head_to_fp32": "model.lm_head_fp32",
    "torch_compile": "model.compile",
    "reward_weights": "reward.functions[i].weight",
    "gradient_checkpointing": "model.gradient_checkpointing",
    "bf16": "model.autocast: bf16 or none (fp16 is refused)",
    "learning_rate": "optim.lr",
    "lr_scheduler_type": "optim.schedule and optim.warmup_steps (linear, cosine, constant)",
    "weight_decay": "optim.weight_decay",
    "adam_beta1": "optim.betas = [adam_beta1, adam_beta2]",
    "max_grad_norm": "optim.max_grad_norm (0 = off in both)",
    "seed": "seed (top level)",
    "full_determinism": "train.deterministic (deterministic kernels; not TRL's CUDA_LAUNCH_BLOCKING)",
    "output_dir": "log.output_dir / log.run_name (the run folder)",
    "report_to": "log.report_to (tensorboard, wandb, trackio)",
    "log_completions": "log.samples_every (every logging_steps; 0 = off)",
    "save_steps": "log.checkpoint_every (optimizer steps -> grpolab steps)",
    "save_total_limit": "log.keep_last",
    # the trl grpo script's names (grpolab.trl.script's SCRIPT_FIELDS)
    "model_name_or_path": "model.name_or_path",
    "dataset_name": "data.source=hf (jsonl for a .jsonl file), data.path",
    "reward_funcs": "reward.functions (TRL's own functions, kind trl)",
    # --- read by another field's rule in convert-trl: these words are the loader's only
    "gradient_accumulation_steps": "train.micro_batch_size (grpolab accumulates micro-batches up to each minibatch)",
    "steps_per_generation": "algo.num_minibatches (optimizer steps per generation batch)",
    "generation_batch_size": "train.prompts_per_step x rollout.num_generations completions",
    "num_generations": "rollout.num_generations",
    "num_iterations": "algo.mu (passes over each generation batch)",
    "num_train_epochs": "train.num_steps (grpolab counts generation batches, not epochs)",
    "epsilon_high": "algo.clip_high (DAPO's Clip-Higher: 0.28)",
    "delta": "algo.dual_clip (TRL's two-sided clip delta, for delta > 1 + epsilon_high)",
    "ref_model_sync_steps": "algo.ref_reset_every",
    "warmup_steps": "optim.warmup_steps",
    "adam_beta2": "optim.betas = [adam_beta1, adam_beta2]",
    "run_name": "log.run_name",
    "logging_steps": "log.samples_every (grpolab logs metrics every step)",
    "multi_objective_aggregation": "algo.advantage: normalize_then_sum (GDPO) = gdpo",
    # --- a legacy TRL name (convert-trl reads it as a warmup_steps below 1)
    "warmup_ratio": "optim.warmup_steps (in optimizer steps)",
}


def trl_hint(key: str) -> str | None:
    """'; TRL's <key> is grpolab's ...' for an unknown key that is a TRL name, else None."""
    words = TRL_NAMES.get(key)
    if words is None:
        return None
    return f"; TRL's {key} is {words}" if words.startswith("the ") else f"; TRL's {key} is grpolab's {words}"
