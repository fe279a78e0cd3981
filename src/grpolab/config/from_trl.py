"""TRL's GRPOConfig fields and the grpolab config keys that do the same job: the table of the README's
"Coming from TRL" section, kept here so that a test checks it against the installed TRL and our config.

The TRL defaults are those of the TRL the test runs against (trl 1.16 when this was written); the test
fails when TRL renames a field or changes a default listed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TrlKey:
    trl: str
    """A field of trl.GRPOConfig."""
    trl_default: Any
    """Its default in TRL."""
    grpolab: tuple[str, ...]
    """Dotted grpolab config keys that do the same job (``reward.functions.weight``: each entry's weight)."""
    note: str
    """How to translate, and where grpolab's default or meaning differs."""


TRL_KEYS: tuple[TrlKey, ...] = (
    TrlKey("num_generations", 8, ("rollout.num_generations",), "G, completions per prompt"),
    TrlKey(
        "beta",
        0.0,
        ("algo.beta",),
        "TRL skips the KL term by default; grpolab keeps DeepSeekMath's 0.04 for grpo",
    ),
    TrlKey(
        "loss_type",
        "dapo",
        ("algo.name", "algo.loss_agg"),
        '"grpo" = algo.name grpo (seq-mean-token-mean, grpolab\'s default); "dapo" and "bnpo" = '
        'loss_agg token-mean; "dr_grpo" = algo.name dr_grpo',
    ),
    TrlKey(
        "scale_rewards",
        "group",
        ("algo.advantage",),
        '"group" = grpo; "none" = dr_grpo; "batch" is near reinforce_pp_baseline, which divides by the '
        "batch std of group-centred rewards rather than of raw rewards",
    ),
    TrlKey("num_iterations", 1, ("algo.mu",), "DeepSeekMath's mu, passes over each generation batch"),
    TrlKey("epsilon", 0.2, ("algo.clip_low",), "ratio clip below 1"),
    TrlKey("epsilon_high", None, ("algo.clip_high",), "null = the low clip; DAPO's clip-higher is 0.28"),
    TrlKey(
        "delta",
        None,
        ("algo.dual_clip",),
        "INTELLECT-2's two-sided clip: for delta > 1 + epsilon_high the same bound as verl's dual clip",
    ),
    TrlKey("importance_sampling_level", "token", ("algo.importance_level",), '"sequence" = GSPO'),
    TrlKey("mask_truncated_completions", False, ("algo.mask_truncated",), "DAPO's overlong filtering"),
    TrlKey(
        "sync_ref_model",
        False,
        ("algo.ref_reset_every",),
        "grpolab copies the policy into the reference every N steps (ref_model_mixup_alpha = 1)",
    ),
    TrlKey("temperature", 1.0, ("rollout.temperature",), "the log-probs are scored at the same temperature"),
    TrlKey("top_p", 1.0, ("rollout.top_p",), ""),
    TrlKey("top_k", 0, ("rollout.top_k",), ""),
    TrlKey("max_completion_length", 512, ("rollout.max_completion_length",), "grpolab: 256"),
    TrlKey(
        "per_device_train_batch_size",
        8,
        ("train.prompts_per_step", "algo.num_minibatches"),
        "grpolab counts prompts per generation batch (x num_generations completions) and the optimizer "
        "steps it is split into; TRL counts completions per device and steps_per_generation",
    ),
    TrlKey("learning_rate", 1e-6, ("optim.lr",), ""),
    TrlKey("lr_scheduler_type", "linear", ("optim.schedule",), "grpolab: constant"),
    TrlKey("adam_beta2", 0.999, ("optim.betas",), "grpolab: (0.9, 0.99)"),
    TrlKey("max_grad_norm", 1.0, ("optim.max_grad_norm",), ""),
    TrlKey("gradient_checkpointing", True, ("model.gradient_checkpointing",), "grpolab: false"),
    TrlKey("max_steps", -1, ("train.num_steps",), "one step = one generation batch"),
    TrlKey("reward_weights", None, ("reward.functions.weight",), "a weight on each reward entry"),
    TrlKey("report_to", "none", ("log.report_to",), "tensorboard, wandb, trackio"),
    TrlKey("project", "huggingface", ("log.project",), "grpolab: grpolab"),
    TrlKey("run_name", None, ("log.run_name",), "also the run directory's name"),
    TrlKey(
        "log_completions", False, ("log.samples_every",), "samples.jsonl and the trackers' completions table"
    ),
    TrlKey("save_steps", 500, ("log.checkpoint_every",), ""),
    TrlKey("seed", 42, ("seed",), "grpolab: 0"),
)


def _cell(value: Any) -> str:
    return "`null`" if value is None else f"`{value!r}`".replace("'", '"')


def markdown_table() -> str:
    """The README table, one row per TRL field."""
    lines = ["| TRL GRPOConfig | TRL default | grpolab | notes |", "|---|---|---|---|"]
    for k in TRL_KEYS:
        keys = ", ".join(f"`{g}`" for g in k.grpolab)
        lines.append(f"| `{k.trl}` | {_cell(k.trl_default)} | {keys} | {k.note} |")
    return "\n".join(lines) + "\n"
