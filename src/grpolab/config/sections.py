"""The sections of a run config: model, data, rollout, algo, reward, optim, train, eval, log."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

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
    """Show progress: a bar on a terminal, else a log line every ~10 s or tenth of the work (grpolab.run.progress)."""
    overwrite: bool = False
    """Let a fresh run (no --resume) start in a run directory that holds checkpoints, deleting them;
    without it that is an error, so that no saved run is lost by mistake."""
