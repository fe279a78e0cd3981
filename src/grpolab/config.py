"""Typed, frozen, validated configuration.

A run is described by one ``Config``: nested dataclasses grouped by concern. YAML files give the
sections as mappings; dotted overrides (``algo.beta=0.0``) are applied on top. Every value is checked
against its declared type (``Literal`` choices included) before any model loads, and every error names
the key and says how to fix it. Derived quantities are properties, never fields mutated later.

Algorithm presets: ``algo.name`` picks defaults for the fields left as ``None`` (advantage estimator,
loss aggregation, where the KL goes); see ``ALGO_PRESETS``. Anything set explicitly wins.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from grpolab.errors import GrpolabError


class ConfigError(GrpolabError, ValueError):
    """A configuration problem, with the key and a fix in the message."""


AlgoName = Literal["grpo", "dr_grpo", "dapo", "rloo", "online_rft", "reinforce_pp", "ppo"]
AdvantageName = Literal["grpo", "dr_grpo", "rloo", "online_rft", "reinforce_pp_baseline", "gae"]
LossAgg = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm", "seq-mean-token-sum"]

# algo.name -> defaults for the algo fields left as None. Sources: ALGORITHMS.md sections 1, 4.
ALGO_PRESETS: dict[str, dict[str, Any]] = {
    "grpo": {"advantage": "grpo", "loss_agg": "seq-mean-token-mean", "kl_in": "loss"},
    "dr_grpo": {"advantage": "dr_grpo", "loss_agg": "seq-mean-token-sum-norm", "kl_in": "loss"},
    "dapo": {"advantage": "grpo", "loss_agg": "token-mean", "kl_in": "loss"},
    "rloo": {"advantage": "rloo", "loss_agg": "seq-mean-token-sum", "kl_in": "reward"},
    "online_rft": {"advantage": "online_rft", "loss_agg": "seq-mean-token-mean", "kl_in": "loss"},
    "reinforce_pp": {"advantage": "reinforce_pp_baseline", "loss_agg": "token-mean", "kl_in": "loss"},
    # PPO as DeepSeekMath Eq. 1 writes it: (1/|o|) sum_t per completion, the same aggregation as GRPO,
    # so `grpolab compare` isolates the critic (TRL and verl use token-mean; set algo.loss_agg for that).
    "ppo": {"advantage": "gae", "loss_agg": "seq-mean-token-mean", "kl_in": "reward"},
}


@dataclass(frozen=True)
class LoraConfig:
    enabled: bool = False
    """Train a LoRA adapter (PEFT) instead of all weights; the reference is then the base model."""
    r: int = 16
    """LoRA rank."""
    alpha: int = 32
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the LoRA branch."""
    target_modules: str | tuple[str, ...] = "all-linear"
    """Module names to adapt, or "all-linear"."""


@dataclass(frozen=True)
class ModelConfig:
    name_or_path: str = ""
    """Policy model: a local folder or a Hugging Face hub id (AutoModelForCausalLM)."""
    tokenizer: str | None = None
    """Tokenizer path or id; defaults to name_or_path."""
    revision: str | None = None
    """Hub revision (branch, tag or commit)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Dtype the trainable weights are kept in. float32 master weights with bf16 autocast is the safe default."""
    autocast: Literal["auto", "bf16", "none"] = "auto"
    """bf16 autocast for forward passes: auto = on for CUDA with bf16 and for CPUs with bf16 matrix units."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to run: auto picks cuda when available."""
    trust_remote_code: bool = False
    """Passed to from_pretrained."""
    gradient_checkpointing: bool = False
    """Trade compute for memory in the training forward (generation keeps its KV cache)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA settings."""


@dataclass(frozen=True)
class DataConfig:
    source: Literal["jsonl", "hf", "reasoning_gym", "arithmetic"] = "jsonl"
    """Where examples come from: a JSONL file, a Hugging Face dataset, a reasoning-gym task, or the built-in arithmetic task."""
    path: str = ""
    """JSONL path, or Hugging Face dataset id / local dataset folder."""
    name: str | None = None
    """Dataset config name (hf) or reasoning-gym dataset name."""
    split: str = "train"
    """Dataset split for training (hf)."""
    prompt_field: str = "prompt"
    """Row field holding the question."""
    answer_field: str | None = "answer"
    """Row field holding the reference answer (None when the rewards need none)."""
    template: str = "none"
    """Prompt template: a key of grpolab.tasks.templates.TEMPLATES ("none", "r1", "r1_think") or a string containing {prompt}."""
    system_prompt: str | None = None
    """System prompt, used with the chat template or prepended to the template."""
    chat_template: bool = False
    """Wrap the templated prompt with the tokenizer's chat template."""
    size: int = 1000
    """Number of generated examples (reasoning_gym, arithmetic)."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """Task parameters (reasoning_gym dataset kwargs, arithmetic options)."""
    eval_size: int = 0
    """Hold out this many examples (fixed, never drawn for training) for evaluation."""
    max_prompt_length: int = 1024
    """Prompts longer than this many tokens are an error naming the row."""
    shuffle: bool = True
    """Reshuffle the training examples every epoch (seeded)."""


@dataclass(frozen=True)
class RolloutConfig:
    num_generations: int = 8
    """G, completions sampled per prompt (DeepSeekMath: 64; DeepSeek-R1-Zero: 16)."""
    max_completion_length: int = 256
    """Generation stops here if no EOS came first (finish_reason "length")."""
    temperature: float = 1.0
    """Sampling temperature; the trainer scores log-probs at the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1.0 = off)."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""
    max_batch_sequences: int | None = None
    """Decode at most this many sequences at once (bounds generation memory)."""


@dataclass(frozen=True)
class AlgoConfig:
    name: AlgoName = "grpo"
    """Algorithm preset; fills the fields below that are left as null (ALGO_PRESETS)."""
    advantage: AdvantageName | None = None
    """Advantage estimator (null = from the preset)."""
    std: Literal["unbiased", "population"] = "unbiased"
    """Which std normalises group rewards (TRL and verl: unbiased)."""
    eps: float = 1e-4
    """Added to the std before dividing."""
    beta: float = 0.04
    """KL coefficient (DeepSeekMath: 0.04). 0 skips the reference model entirely."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator used in the loss (DeepSeekMath eq. 4 is k3)."""
    kl_in: Literal["loss", "reward"] | None = None
    """Where the KL penalty goes: the loss (GRPO) or the per-token reward (PPO, RLOO). null = preset."""
    clip_low: float = 0.2
    """epsilon below 1 for the ratio clip."""
    clip_high: float | None = None
    """epsilon above 1 (Clip-Higher, DAPO: 0.28); null = clip_low."""
    dual_clip: float | None = None
    """Dual-clip constant c for negative advantages (verl: 3.0); null = off."""
    importance_level: Literal["token", "sequence"] = "token"
    """token = PPO/GRPO ratio; sequence = GSPO's length-normalised sequence ratio."""
    loss_agg: LossAgg | None = None
    """Loss aggregation (null = preset)."""
    mu: int = 1
    """Optimisation passes over each generation batch (DeepSeekMath mu; TRL num_iterations)."""
    num_minibatches: int = 1
    """Optimizer steps per pass: the generation batch is split into this many minibatches."""
    ref_reset_every: int = 0
    """Reset the reference to the current policy every N steps (DeepSeek-R1: 400); 0 = never."""
    mask_truncated: bool = False
    """DAPO overlong filtering: completions without EOS get no loss."""
    supervision: Literal["outcome", "process"] = "outcome"
    """outcome: one advantage per completion from reward.functions; process: per-step advantages from
    reward.process (DeepSeekMath Sec. 4.1.3), with reward.functions only logged."""
    gamma: float = 1.0
    """PPO: GAE discount (TRL, verl: 1.0); a completion is one episode scored at its end."""
    lam: float = 1.0
    """PPO: GAE lambda. 1.0, not TRL's 0.95: DeepSeek-R1 supp. A.3 found PPO close to GRPO only with lambda = 1.0
    (0.95 was clearly worse); with gamma = lambda = 1, A_t = (score - sum of later KL penalties) - V(s_t)."""
    vf_coef: float = 0.1
    """PPO: value-loss coefficient (TRL: 0.1). The critic has its own AdamW, so this scales its gradient
    before the optim.max_grad_norm clip rather than its step size."""
    value_clip: float | None = 0.2
    """PPO: c_v of the clipped value loss, clip(V, V_old - c_v, V_old + c_v) (verl, TRL: 0.2); null = unclipped."""
    value_lr: float | None = None
    """PPO: learning rate of the critic's own optimizer (OpenRLHF: 9x the actor's); null = optim.lr."""
    critic_warmup_steps: int = 0
    """PPO: for the first N steps only the critic is trained; the policy is left unchanged."""
    whiten_advantages: bool = True
    """PPO: whiten the GAE advantages over the batch's counted tokens (masked mean and std, as verl and TRL)."""
    value_init: Literal["policy", "reward_model"] = "policy"
    """PPO: the value model's body starts from the policy checkpoint (with a zero scalar head) or from a
    reward model (body and head)."""
    value_init_path: str | None = None
    """PPO: reward-model folder or hub id (AutoModelForSequenceClassification, 1 label) for value_init=reward_model."""

    @property
    def preset(self) -> dict[str, Any]:
        return ALGO_PRESETS[self.name]

    @property
    def resolved_advantage(self) -> str:
        return self.advantage or self.preset["advantage"]

    @property
    def resolved_loss_agg(self) -> str:
        return self.loss_agg or self.preset["loss_agg"]

    @property
    def resolved_kl_in(self) -> str:
        return self.kl_in or self.preset["kl_in"]

    @property
    def resolved_clip_high(self) -> float:
        return self.clip_low if self.clip_high is None else self.clip_high

    @property
    def needs_reference(self) -> bool:
        return self.beta > 0

    @property
    def needs_critic(self) -> bool:
        """True for PPO: GAE needs a learned value model."""
        return self.resolved_advantage == "gae"


@dataclass(frozen=True)
class RewardSpec:
    name: str = ""
    """A registry key of grpolab.rewards.REWARDS, or "package.module:function"."""
    weight: float = 1.0
    """Weight in the total reward."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Arguments for the reward factory."""


@dataclass(frozen=True)
class ProcessRewardSpec:
    """A process reward (algo.supervision=process): one value per reasoning step of a completion."""

    name: str = ""
    """A key of grpolab.rewards.process.PROCESS_REWARDS ("reward_model": a neural model scoring each step
    prefix), or "package.module:function" for a rule fn(steps: list[str], example) -> list[float]."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Arguments for the process reward factory (or bound into the rule function)."""
    delimiter: str = "\n"
    """Text that ends a step. Step ends are found in the completion's token ids (the delimiter's token ids,
    or, for a one-token delimiter, any token whose text contains it), never by re-tokenizing text."""


@dataclass(frozen=True)
class RewardConfig:
    functions: tuple[RewardSpec, ...] = ()
    """Rewards summed with their weights; each component is logged as train/reward/<name>."""
    timeout_s: float = 60.0
    """Per-call time limit for a reward on one batch."""
    dry_run_examples: int = 4
    """Examples each reward is tried on before training starts (0 = skip)."""
    process: ProcessRewardSpec | None = None
    """The step-level reward used when algo.supervision=process; null otherwise."""


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-6
    """Peak learning rate (DeepSeekMath: 1e-6 for 7B; tiny models need ~1e-4)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip (0 = off)."""
    warmup_steps: int = 0
    """Linear warm-up, in optimizer steps."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule after warm-up."""


@dataclass(frozen=True)
class TrainConfig:
    num_steps: int = 100
    """Training steps; one step = one generation batch."""
    prompts_per_step: int = 8
    """P, prompts per generation batch (completions per step = P * G)."""
    micro_batch_size: int = 64
    """Sequences per forward/backward (gradient accumulation over a minibatch)."""
    max_bad_steps: int = 3
    """Stop (TrainingError, last good checkpoint kept) after this many steps in a row whose update was
    skipped for a NaN or infinite loss or gradient; 0 = never stop, only skip."""


@dataclass(frozen=True)
class EvalConfig:
    every: int = 0
    """Evaluate on the held-out set every N steps (0 = only when asked)."""
    num_samples: int = 16
    """n samples per eval prompt for Pass@K / Maj@K."""
    temperature: float = 1.0
    """Sampling temperature for evaluation (DeepSeekMath fig. 7: 0.7)."""
    max_prompts: int = 0
    """Evaluate on at most this many held-out prompts (0 = all)."""
    greedy: bool = True
    """Also report greedy accuracy."""
    checkpoints: tuple[str, ...] = ()
    """Model folders (or hub ids) that ``grpolab eval`` compares; empty = model.name_or_path."""
    ks: tuple[int, ...] = ()
    """K values for Pass@K / Maj@K; empty = 1, 2, 4, ... up to num_samples."""
    correct_threshold: float = 0.5
    """A sample counts as correct when its total reward is above this."""
    prompts_per_batch: int = 32
    """Eval prompts sampled together (each with num_samples completions)."""
    output_dir: str = ""
    """Where eval JSON and plots go; empty = <log.output_dir>/<log.run_name>/eval."""


@dataclass(frozen=True)
class SFTConfig:
    """Supervised warm start (``grpolab sft``): cross-entropy on the answer tokens and EOS only."""

    steps: int = 1000
    """Maximum optimizer steps; fewer when target_accuracy is reached first."""
    batch_size: int = 64
    """Examples per optimizer step (split into train.micro_batch_size forwards)."""
    lr: float = 1e-5
    """AdamW learning rate (a 0.5M-parameter model trained from scratch: 1e-3)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    completion_format: str = "{answer}"
    """Target text, with {answer} replaced by the example's answer; EOS is appended."""
    target_accuracy: float | None = None
    """Stop once greedy dev accuracy reaches this (ALGORITHMS 6.0); null = run all steps."""
    check_every: int = 25
    """Steps between dev-accuracy checks."""
    dev_size: int = 200
    """Training examples set aside, never trained on, to check target_accuracy."""
    output_dir: str = ""
    """Model folder the result is saved to; empty = <log.output_dir>/<log.run_name>/sft."""


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
            (not 0 <= self.eval_fraction < 1, "reward_model.eval_fraction must be in [0, 1) (0.1 = 10% held out)"),
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
            (not 0 <= self.replay_fraction <= 1, "iterative.replay_fraction must be in [0, 1] (DeepSeekMath: 0.1)"),
            (self.pairs_per_group < 1, "iterative.pairs_per_group must be >= 1"),
        ]
        for bad, message in checks:
            if bad:
                raise ConfigError(message)


@dataclass(frozen=True)
class LogConfig:
    output_dir: str = "runs"
    """Parent folder of run directories."""
    run_name: str = "run"
    """Run directory name: output_dir/run_name."""
    checkpoint_every: int = 50
    """Save a checkpoint every N steps (and at the end); 0 = only at the end."""
    keep_last: int = 2
    """Checkpoints kept on disk."""
    samples_every: int = 1
    """Write samples.jsonl every N steps (0 = never)."""
    tensorboard: bool = True
    """Also write TensorBoard events."""
    progress: bool = True
    """Show a progress bar."""
    overwrite: bool = False
    """Let a fresh run (no --resume) start in a run directory that holds checkpoints, deleting them;
    without it that is an error, so that no saved run is lost by mistake."""


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    iterative: IterativeConfig = field(default_factory=IterativeConfig)
    log: LogConfig = field(default_factory=LogConfig)
    seed: int = 0
    """Seeds every RNG (python, torch, sampling, data order)."""

    def __post_init__(self) -> None:
        _check_cross_fields(self)

    @property
    def completions_per_step(self) -> int:
        return self.train.prompts_per_step * self.rollout.num_generations

    @property
    def optimizer_steps_per_generation(self) -> int:
        return self.algo.mu * self.algo.num_minibatches

    @property
    def run_dir(self) -> Path:
        return Path(self.log.output_dir) / self.log.run_name

    @property
    def sft_dir(self) -> Path:
        """The model folder ``grpolab sft`` writes."""
        return Path(self.sft.output_dir) if self.sft.output_dir else self.run_dir / "sft"

    @property
    def reward_model_dir(self) -> Path:
        """The model folder ``grpolab train-rm`` writes."""
        rm = self.reward_model
        return Path(rm.output_dir) if rm.output_dir else self.run_dir / "reward_model"

    @property
    def eval_dir(self) -> Path:
        """The folder ``grpolab eval`` writes."""
        return Path(self.eval.output_dir) if self.eval.output_dir else self.run_dir / "eval"

    def derived(self) -> dict[str, int]:
        """The quantities a user should see at start."""
        return {
            "prompts_per_step": self.train.prompts_per_step,
            "completions_per_step": self.completions_per_step,
            "optimizer_steps_per_generation": self.optimizer_steps_per_generation,
            "max_completion_tokens_per_step": self.completions_per_step * self.rollout.max_completion_length,
        }


def _check_cross_fields(cfg: Config) -> None:
    a, r, t = cfg.algo, cfg.rollout, cfg.train
    needs_group = a.resolved_advantage in {"grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"}
    if needs_group and r.num_generations < 2:
        raise ConfigError(
            f"rollout.num_generations={r.num_generations}: algo '{a.name}' compares completions within a "
            "group, so it needs at least 2 per prompt. Set rollout.num_generations >= 2 (DeepSeekMath used 64)."
        )
    checks = [
        (r.num_generations < 1, "rollout.num_generations must be >= 1"),
        (t.prompts_per_step < 1, "train.prompts_per_step must be >= 1"),
        (t.num_steps < 0, "train.num_steps must be >= 0"),
        (t.micro_batch_size < 1, "train.micro_batch_size must be >= 1"),
        (r.max_completion_length < 1, "rollout.max_completion_length must be >= 1"),
        (r.temperature < 0, "rollout.temperature must be >= 0 (0 = greedy)"),
        (not 0 < r.top_p <= 1, "rollout.top_p must be in (0, 1]"),
        (r.top_k < 0, "rollout.top_k must be >= 0 (0 = off)"),
        (a.mu < 1, "algo.mu must be >= 1 (1 = a single update per generation batch)"),
        (a.num_minibatches < 1, "algo.num_minibatches must be >= 1"),
        (a.beta < 0, "algo.beta must be >= 0 (0 = no KL and no reference model)"),
        (a.clip_low < 0 or a.resolved_clip_high < 0, "algo.clip_low and algo.clip_high must be >= 0"),
        (a.dual_clip is not None and a.dual_clip <= 1, "algo.dual_clip must be > 1 (verl uses 3.0), or null"),
        (cfg.optim.lr <= 0, "optim.lr must be > 0"),
        (cfg.eval.num_samples < 1, "eval.num_samples must be >= 1"),
        (any(not 0 < k <= cfg.eval.num_samples for k in cfg.eval.ks), "eval.ks must be in 1..eval.num_samples"),
        (cfg.eval.prompts_per_batch < 1, "eval.prompts_per_batch must be >= 1"),
        (cfg.sft.steps < 0 or cfg.sft.batch_size < 1, "sft.steps must be >= 0 and sft.batch_size >= 1"),
        (cfg.sft.check_every < 1, "sft.check_every must be >= 1"),
        ("{answer}" not in cfg.sft.completion_format, "sft.completion_format must contain {answer}"),
        (cfg.log.keep_last < 1, "log.keep_last must be >= 1"),
        (cfg.log.checkpoint_every < 0, "log.checkpoint_every must be >= 0 (0 = only at the end)"),
        (t.max_bad_steps < 0, "train.max_bad_steps must be >= 0 (0 = skip bad updates but never stop)"),
        (cfg.reward.timeout_s <= 0, "reward.timeout_s must be > 0 (seconds per reward call on a batch)"),
    ]
    for bad, message in checks:
        if bad:
            raise ConfigError(message)
    n = cfg.completions_per_step
    if n % a.num_minibatches or (n // a.num_minibatches) % r.num_generations:
        raise ConfigError(
            f"algo.num_minibatches={a.num_minibatches} must split the {n} completions per step into whole "
            f"groups of rollout.num_generations={r.num_generations}: make train.prompts_per_step "
            f"({t.prompts_per_step}) divisible by algo.num_minibatches."
        )
    if a.resolved_advantage == "gae" and a.name != "ppo":
        raise ConfigError("algo.advantage='gae' needs a value model: set algo.name=ppo.")
    if a.name == "ppo" or a.needs_critic:
        _check_ppo(a)
    if a.supervision == "process":
        _check_process(cfg)


def _check_process(cfg: Config) -> None:
    a, spec = cfg.algo, cfg.reward.process
    if spec is None or not spec.name:
        raise ConfigError(
            "algo.supervision=process needs reward.process, e.g. "
            "reward.process={name: 'my_module:step_scores', delimiter: '\\n'}"
        )
    if not spec.delimiter:
        raise ConfigError("reward.process.delimiter is empty: give the text that ends a step, e.g. '\\n'")
    if a.resolved_advantage != "grpo" or a.resolved_kl_in != "loss":
        raise ConfigError(
            "algo.supervision=process implements GRPO with process supervision (DeepSeekMath Sec. 4.1.3): "
            "use algo.name=grpo (or dapo) with algo.advantage=grpo and the KL in the loss"
        )


def _check_ppo(a: AlgoConfig) -> None:
    checks = [
        (not 0 <= a.gamma <= 1, "algo.gamma must be in [0, 1] (1.0 = undiscounted, as TRL and verl)"),
        (not 0 <= a.lam <= 1, "algo.lam must be in [0, 1] (DeepSeek-R1 supp. A.3: 1.0; TRL: 0.95)"),
        (a.vf_coef <= 0, "algo.vf_coef must be > 0 (TRL: 0.1)"),
        (a.value_clip is not None and a.value_clip <= 0, "algo.value_clip must be > 0 (0.2), or null for no clip"),
        (a.value_lr is not None and a.value_lr <= 0, "algo.value_lr must be > 0, or null for optim.lr"),
        (a.critic_warmup_steps < 0, "algo.critic_warmup_steps must be >= 0 (0 = no critic warm-up)"),
        (
            a.value_init == "reward_model" and not a.value_init_path,
            "algo.value_init=reward_model needs algo.value_init_path, the reward model's folder or hub id "
            "(or use algo.value_init=policy)",
        ),
    ]
    for bad, message in checks:
        if bad:
            raise ConfigError(message)


# ----------------------------------------------------------------------------------- loading


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Read a YAML file (optional), apply ``key.sub=value`` overrides, validate, return a Config."""
    raw: dict[str, Any] = {}
    if path is not None:
        raw = _read_yaml(Path(path))
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override '{item}' must look like section.key=value, e.g. algo.beta=0.0")
        _set_dotted(raw, key.strip(), _parse_scalar(text))
    return config_from_dict(raw)


def config_from_dict(raw: Mapping[str, Any]) -> Config:
    try:
        return _build(Config, raw, prefix="")
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:  # a constructor check that is not a ConfigError
        raise ConfigError(str(err)) from err


def config_to_dict(cfg: Any) -> Any:
    """Plain data (dicts, lists, scalars) for YAML / JSON output."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: config_to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, Mapping):
        return {k: config_to_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, tuple | list):
        return [config_to_dict(v) for v in cfg]
    return cfg


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model:, algo:, ...)")
    return data


def _parse_scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override '{key}': '{part}' is a value, not a section")
        node = child
    node[parts[-1]] = value


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config key '{prefix.rstrip('.') or '<top>'}' must be a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in raw:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; known keys: {', '.join(names)}"
            raise ConfigError(f"unknown config key '{prefix}{key}'{hint}")
    values = {k: _coerce(hints[k], v, f"{prefix}{k}") for k, v in raw.items()}
    return cls(**values)


def _coerce(tp: Any, value: Any, key: str) -> Any:  # noqa: C901 - one branch per kind of type
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key + ".")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"config key '{key}': {value!r} is not one of {list(choices)}{hint}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(arg, value, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(
            errors[0] if len(errors) == 1 else f"config key '{key}': {value!r} fits none of {tp}"
        )
    if origin is tuple:
        if not isinstance(value, list | tuple):
            value = [value] if isinstance(value, str | Mapping) else value
        if not isinstance(value, list | tuple):
            raise ConfigError(f"config key '{key}' must be a list, got {value!r}")
        args = typing.get_args(tp)
        item_types = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(item_types) != len(value):
            raise ConfigError(f"config key '{key}' needs {len(item_types)} values, got {len(value)}")
        return tuple(
            _coerce(t, v, f"{key}[{i}]") for i, (t, v) in enumerate(zip(item_types, value, strict=True))
        )
    if origin is Mapping or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"config key '{key}' must be a mapping, got {value!r}")
        return dict(value)
    return _coerce_scalar(tp, value, key)


def _coerce_scalar(tp: Any, value: Any, key: str) -> Any:
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads 1e-6 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        raise ConfigError(f"config key '{key}': unsupported type {tp}")
    raise ConfigError(f"config key '{key}' must be {tp.__name__}, got {value!r} ({type(value).__name__})")
