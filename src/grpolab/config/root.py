"""The whole run config and its derived quantities; its checks are in config/checks.py."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from grpolab.config.algo_section import AlgoConfig
from grpolab.config.checks import check_cross_fields, check_ranges, warn_config
from grpolab.config.engine import VLLMConfig
from grpolab.config.sections import (
    DataConfig,
    EnvConfig,
    EvalConfig,
    LogConfig,
    ModelConfig,
    OptimConfig,
    RewardConfig,
    RolloutConfig,
    TrainConfig,
)
from grpolab.config.stages import ClaimsConfig, IterativeConfig, RewardModelConfig, SFTConfig


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    iterative: IterativeConfig = field(default_factory=IterativeConfig)
    claims: ClaimsConfig = field(default_factory=ClaimsConfig)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """The vLLM engine's settings, read when rollout.engine=vllm (docs/vllm.md)."""
    log: LogConfig = field(default_factory=LogConfig)
    seed: int = 0
    """Seeds every RNG (python, torch, sampling, data order)."""

    def __post_init__(self) -> None:
        check_ranges(self)  # every number finite and in range, first: NaN passes every comparison below
        fitted = _fit_preset_minibatches(self)
        check_cross_fields(self)
        warn_config(self, fitted)  # the settings that do less than they say (config/checks.py)

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


def _fit_preset_minibatches(cfg: Config) -> list[str]:
    """A preset's minibatch count (DAPO, CISPO: 16) that does not divide train.prompts_per_step into whole
    groups becomes the largest count that does, with one warning (returned); a count set explicitly is never
    changed."""
    a, prompts = cfg.algo, cfg.train.prompts_per_step
    if not a.from_preset("num_minibatches") or prompts < 1 or a.num_minibatches < 1:
        return []
    if prompts % a.num_minibatches == 0:
        return []
    fit = max(d for d in range(1, a.num_minibatches + 1) if prompts % d == 0)
    n = a.num_minibatches
    object.__setattr__(cfg, "algo", dataclasses.replace(a, num_minibatches=fit))
    return [
        f"algo.name={a.name}: the preset's {n} minibatches per step need train.prompts_per_step divisible by {n}; "
        f"with {prompts} prompts per step it runs {fit} (set train.prompts_per_step={n} for the paper's {n} "
        "updates per rollout)"
    ]

