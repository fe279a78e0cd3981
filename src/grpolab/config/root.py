"""The whole run config and its derived quantities; its checks are in config/checks.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpolab.config.algo_section import AlgoConfig, preset_algo
from grpolab.config.checks import check_cross_fields, check_ranges
from grpolab.config.engine import VLLMConfig
from grpolab.config.inert import warn_config
from grpolab.config.resolve import NOT_A_KEY, from_preset
from grpolab.config.run_sections import EvalConfig, LogConfig, OptimConfig, TrainConfig
from grpolab.config.sections import DataConfig, EnvConfig, ModelConfig, RewardConfig, RolloutConfig
from grpolab.config.stages import ClaimsConfig, IterativeConfig, RewardModelConfig, SFTConfig


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    algo: AlgoConfig = field(default_factory=preset_algo)
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
    settings: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False, metadata=NOT_A_KEY)
    """What the user wrote (the file with its overrides applied, nested plain data) and this config was resolved
    from: ``derive`` builds every other config from it. Not a config key: never read from or written to YAML."""

    def __post_init__(self) -> None:
        check_ranges(self)  # every number finite and in range, first: NaN passes every comparison below
        check_cross_fields(self)
        warn_config(self)  # the settings that do less than they say (config/checks.py)

    def from_preset(self, key: str) -> bool:
        """True when the dotted ``algo.<field>`` ``key`` holds the preset's value because the user left it unset."""
        return from_preset(self.settings, key)

    @property
    def completions_per_step(self) -> int:
        return self.train.prompts_per_step * self.rollout.num_generations

    @property
    def longest_sequence(self) -> int:
        """The most tokens one training sequence can hold: the longest prompt and the longest completion."""
        return self.data.max_prompt_length + self.rollout.max_completion_length

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

