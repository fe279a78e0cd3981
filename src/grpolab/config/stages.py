"""Config sections of the stages around RL: SFT, reward-model training, iterative RL, the claims run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from grpolab.config.sections import RewardSpec
from grpolab.errors import ConfigError


@dataclass(frozen=True)
class SFTConfig:
    """Supervised warm start (``grpolab sft``): cross-entropy on the answer tokens and EOS only."""

    steps: int = 1000
    """Maximum optimizer steps; fewer when the targets (target_accuracy, target_format_errors) are reached first."""
    batch_size: int = 64
    """Examples per optimizer step (split into train.micro_batch_size forwards)."""
    lr: float = 1e-5
    """AdamW learning rate (a 0.5M-parameter model trained from scratch: 1e-3)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    completion_format: str = "{answer}"
    """Target text, with {answer} replaced by the example's answer; EOS is appended."""
    target_accuracy: float | None = None
    """Stop once greedy dev accuracy reaches this (docs/algorithms.md 6.0); null = run all steps."""
    target_format_errors: float | None = None
    """Stop once the share of format errors among the greedy dev replies is at most this (wrong by the rewards
    and right by eval.blind_grader, or no answer extracted); with target_accuracy too, once both are reached;
    null = not a stop."""
    check_every: int = 25
    """Steps between dev checks (target_accuracy, target_format_errors)."""
    dev_size: int = 200
    """Training examples set aside, never trained on, to check the targets."""
    output_dir: str = ""
    """Model folder the result is saved to; empty = <log.output_dir>/<log.run_name>/sft."""

    def __post_init__(self) -> None:
        if self.target_format_errors is not None and not 0 <= self.target_format_errors < 1:
            raise ConfigError("sft.target_format_errors must be in [0, 1) (e.g. 0.05), or null")


@dataclass(frozen=True)
class RewardModelConfig:
    """``grpolab train-rm``: a neural reward model trained on pairwise comparisons (Bradley-Terry)."""

    base_model: str = ""
    """Starting weights, folder or hub id: a causal LM (a new one-output head is added) or a reward model
    (AutoModelForSequenceClassification, num_labels=1), whose training then continues."""
    tokenizer: str | None = None
    """Tokenizer path or id; defaults to base_model."""
    data_path: str = ""
    """JSONL, one comparison per line: {"prompt": ..., "chosen": ..., "rejected": ...}."""
    eval_fraction: float = 0.1
    """Share of the prompts (all their pairs) held out, seeded, to report eval/pair_accuracy."""
    lr: float = 1e-5
    """AdamW learning rate (a tiny model trained from scratch: ~1e-3)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    epochs: int = 1
    """Passes over the training pairs."""
    batch_size: int = 8
    """Comparisons per optimizer step (each is two forward sequences)."""
    max_length: int = 1024
    """Tokens of prompt + response; longer texts keep their end (the response) and lose their start."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip (0 = off)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train: auto picks cuda when available."""
    autocast: Literal["auto", "bf16", "none"] = "auto"
    """bf16 autocast for forward passes, as model.autocast."""
    output_dir: str = ""
    """Model folder the trained reward model is saved to; empty = <log.output_dir>/<log.run_name>/reward_model."""

    def __post_init__(self) -> None:
        checks = [
            (
                not 0 <= self.eval_fraction < 1,
                "reward_model.eval_fraction must be in [0, 1) (0.1 = 10% held out)",
            ),
            (self.lr <= 0, "reward_model.lr must be > 0"),
            (self.epochs < 1, "reward_model.epochs must be >= 1"),
            (self.batch_size < 1, "reward_model.batch_size must be >= 1"),
            (self.max_length < 2, "reward_model.max_length must be >= 2"),
        ]
        for bad, message in checks:
            if bad:
                raise ConfigError(message)


@dataclass(frozen=True)
class IterativeConfig:
    """Iterative RL (DeepSeekMath Algorithm 1, ``grpolab train-iterative``): policy and reward model in turn."""

    iterations: int = 2
    """Outer iterations I (DeepSeekMath ran two; the first gave most of the gain)."""
    steps_per_iteration: int = 100
    """GRPO steps M per iteration; the reference is reset to the policy at the start of each."""
    replay_fraction: float = 0.1
    """Share of the historical comparisons replayed with each iteration's new ones (DeepSeekMath: 10%)."""
    label_rewards: tuple[RewardSpec, ...] = ()
    """Gold signal (e.g. exact_match) that ranks a group's completions to make new comparisons."""
    pairs_per_group: int = 1
    """At most this many (higher, lower) comparisons per prompt group and step."""

    def __post_init__(self) -> None:
        checks = [
            (self.iterations < 1, "iterative.iterations must be >= 1"),
            (self.steps_per_iteration < 1, "iterative.steps_per_iteration must be >= 1"),
            (
                not 0 <= self.replay_fraction <= 1,
                "iterative.replay_fraction must be in [0, 1] (DeepSeekMath: 0.1)",
            ),
            (self.pairs_per_group < 1, "iterative.pairs_per_group must be >= 1"),
        ]
        for bad, message in checks:
            if bad:
                raise ConfigError(message)


@dataclass(frozen=True)
class ClaimsConfig:
    """``grpolab claims``: the seeds' claims measured on one model and task (studies/claims.py). The
    experiments share the config's prompts, seed and train.num_steps; what differs is named here."""

    group_sizes: tuple[int, ...] = (4, 8, 16)
    """Claim 2: the G values trained at the same train.prompts_per_step; must hold rollout.num_generations,
    whose run is the GRPO run of claim 1 (not trained twice)."""
    hard_params: Mapping[str, Any] = field(default_factory=dict)
    """Claim 4: data.params of the second, harder held-out kind (same data.source), e.g. 3-digit operands;
    {} = only the config's own kind."""
    eval_prompts: int = 30
    """Claim 4: held-out prompts of each kind, each sampled eval.num_samples times (64: K up to 64)."""
    kl_prompts: int = 16
    """Claim 3: held-out prompts whose completions measure k1, k3 and the exact KL."""
    kl_samples: int = 8
    """Claim 3: completions sampled per prompt from the trained policy at T=1."""
    rm_prompts: int = 64
    """Claim 5: training prompts sampled rollout.num_generations times from the starting model; the rule reward
    labels the samples, and each prompt with a right and a wrong one gives preference pairs."""
    rm_pairs_per_prompt: int = 4
    """Claim 5: at most this many (right, wrong) pairs per prompt."""
    hacking_betas: tuple[float, ...] = (0.0,)
    """Claim 5: algo.beta of each GRPO run on the reward model alone (the KL budgets)."""
    hacking_proxy: RewardSpec | None = None
    """Claim 5: the proxy reward the runs train on alone, e.g. a judge ({name: judge, kwargs: {...}},
    docs/rewards.md); null = a reward model trained from the starting model's samples."""
    hacking_lr: float | None = None
    """Claim 5: optim.lr of the runs on the reward model (a larger one pushes further); null = optim.lr."""
    hacking_steps: int = 0
    """Claim 5: steps of each run on the reward model; 0 = train.num_steps."""
    warm_start: bool = False
    """Stage 0: ``grpolab sft`` of model.name_or_path on the task's answer format (the sft: section; sft.steps
    is its budget, sft.target_format_errors its stop), as DeepSeekMath's RL starts from its Instruct model; the
    warm-started model is then the start of every experiment. false = start from model.name_or_path."""
    seeds: int = 1
    """Claims 1 and 2: each training run once per seed (seed, seed + 1, ...), the ratios reported as mean and
    range; claims 3, 4 and 5 read the first seed's GRPO run."""

    def __post_init__(self) -> None:
        checks = [
            (not self.group_sizes or min(self.group_sizes) < 2, "claims.group_sizes: give G values >= 2, e.g. [4, 8, 16]"),
            (len(set(self.group_sizes)) != len(self.group_sizes), "claims.group_sizes: the G values must be distinct"),
            (self.eval_prompts < 1, "claims.eval_prompts must be >= 1"),
            (self.kl_prompts < 1 or self.kl_samples < 1, "claims.kl_prompts and claims.kl_samples must be >= 1"),
            (self.rm_prompts < 2 or self.rm_pairs_per_prompt < 1, "claims.rm_prompts must be >= 2 and rm_pairs_per_prompt >= 1"),
            (not self.hacking_betas or min(self.hacking_betas) < 0, "claims.hacking_betas: give betas >= 0, e.g. [0.0, 0.04]"),
            (self.hacking_lr is not None and not self.hacking_lr > 0, "claims.hacking_lr must be > 0 (or null)"),
            (self.hacking_steps < 0, "claims.hacking_steps must be >= 0 (0 = train.num_steps)"),
            (self.seeds < 1, "claims.seeds must be >= 1 (e.g. 3: seed, seed + 1, seed + 2)"),
        ]
        for bad, message in checks:
            if bad:
                raise ConfigError(message)
