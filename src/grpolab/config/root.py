"""The whole run config, its derived quantities, and the checks across sections."""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from urllib.parse import urlsplit

from grpolab.config.advice import warn_config
from grpolab.config.engine import VLLMConfig
from grpolab.config.sections import (
    ALGO_PRESETS,
    AlgoConfig,
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
from grpolab.config.stages import IterativeConfig, RewardModelConfig, SFTConfig
from grpolab.config.validate import check_numbers
from grpolab.errors import ConfigError

log = logging.getLogger("grpolab.config")


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
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """The vLLM engine's settings, read when rollout.engine=vllm (docs/vllm.md)."""
    log: LogConfig = field(default_factory=LogConfig)
    seed: int = 0
    """Seeds every RNG (python, torch, sampling, data order)."""

    def __post_init__(self) -> None:
        check_numbers(self)  # every number finite and in range, first: NaN passes every comparison below
        _fit_preset_minibatches(self)
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


def _fit_preset_minibatches(cfg: Config) -> None:
    """A preset's minibatch count (DAPO, CISPO: 16) that does not divide train.prompts_per_step into whole
    groups becomes the largest count that does, with one warning; a count set explicitly is never changed."""
    a, prompts = cfg.algo, cfg.train.prompts_per_step
    if not a.from_preset("num_minibatches") or prompts < 1 or a.num_minibatches < 1:
        return
    if prompts % a.num_minibatches == 0:
        return
    fit = max(d for d in range(1, a.num_minibatches + 1) if prompts % d == 0)
    log.warning(
        "algo.name=%s: the preset's %d minibatches per step need train.prompts_per_step divisible by %d; with %d "
        "prompts per step it runs %d (set train.prompts_per_step=%d for the paper's %d updates per rollout)",
        a.name, a.num_minibatches, a.num_minibatches, prompts, fit, a.num_minibatches, a.num_minibatches,
    )
    object.__setattr__(cfg, "algo", dataclasses.replace(a, num_minibatches=fit))


def _check_cross_fields(cfg: Config) -> None:
    a, r, t = cfg.algo, cfg.rollout, cfg.train
    needs_group = a.advantage in {"grpo", "dr_grpo", "rloo", "batch_std", "reinforce_pp_baseline"}
    if (needs_group or a.dynamic_sampling) and r.num_generations < 2:
        raise ConfigError(
            f"rollout.num_generations={r.num_generations}: algo '{a.name}' compares completions within a "
            "group, so it needs at least 2 per prompt. Set rollout.num_generations >= 2 (DeepSeekMath used 64)."
        )
    checks = [
        (r.num_generations < 1, "rollout.num_generations must be >= 1"),
        (t.prompts_per_step < 1, "train.prompts_per_step must be >= 1"),
        (t.num_steps < 0, "train.num_steps must be >= 0"),
        (t.micro_batch_size < 1, "train.micro_batch_size must be >= 1"),
        (
            t.max_tokens_per_micro_batch is not None and t.max_tokens_per_micro_batch < 1,
            "train.max_tokens_per_micro_batch must be >= 1 (padded tokens per forward), or null for rows only",
        ),
        (r.max_completion_length < 1, "rollout.max_completion_length must be >= 1"),
        (r.temperature < 0, "rollout.temperature must be >= 0 (0 = greedy)"),
        (not 0 < r.top_p <= 1, "rollout.top_p must be in (0, 1]"),
        (r.top_k < 0, "rollout.top_k must be >= 0 (0 = off)"),
        (a.mu < 1, "algo.mu must be >= 1 (1 = a single update per generation batch)"),
        (a.num_minibatches < 1, "algo.num_minibatches must be >= 1"),
        (a.beta < 0, "algo.beta must be >= 0 (0 = no KL and no reference model)"),
        (a.clip_low < 0 or a.resolved_clip_high < 0, "algo.clip_low and algo.clip_high must be >= 0"),
        (a.dual_clip is not None and a.dual_clip <= 1, "algo.dual_clip must be > 1 (verl uses 3.0), or null"),
        (a.max_sampling_rounds < 1, "algo.max_sampling_rounds must be >= 1 (verl: 10)"),
        (a.rollout_correction_cap <= 0, "algo.rollout_correction_cap must be > 0 (TIS: 2.0)"),
        (a.entropy_coef < 0, "algo.entropy_coef must be >= 0 (0 = no entropy bonus)"),
        (
            a.policy_loss == "cispo" and (a.importance_level != "token" or a.dual_clip is not None),
            "algo.policy_loss=cispo clips a per-token IS weight: set algo.importance_level=token and algo.dual_clip=null",
        ),
        (cfg.optim.lr <= 0, "optim.lr must be > 0"),
        (cfg.eval.num_samples < 1, "eval.num_samples must be >= 1"),
        (
            any(not 0 < k <= cfg.eval.num_samples for k in cfg.eval.ks),
            "eval.ks must be in 1..eval.num_samples",
        ),
        (cfg.eval.prompts_per_batch < 1, "eval.prompts_per_batch must be >= 1"),
        (cfg.sft.steps < 0 or cfg.sft.batch_size < 1, "sft.steps must be >= 0 and sft.batch_size >= 1"),
        (cfg.sft.check_every < 1, "sft.check_every must be >= 1"),
        ("{answer}" not in cfg.sft.completion_format, "sft.completion_format must contain {answer}"),
        (cfg.log.keep_last < 1, "log.keep_last must be >= 1"),
        (cfg.log.checkpoint_every < 0, "log.checkpoint_every must be >= 0 (0 = only at the end)"),
        (
            r.kv_cache_budget_mb is not None and r.kv_cache_budget_mb <= 0,
            "rollout.kv_cache_budget_mb must be > 0 (MB for the sampler's KV cache), or null for a share of free memory",
        ),
        (cfg.env.max_turns < 1, "env.max_turns must be >= 1"),
        (cfg.env.max_episode_tokens < 1, "env.max_episode_tokens must be >= 1"),
        (cfg.env.tool_timeout_s <= 0, "env.tool_timeout_s must be > 0 (seconds per tool call)"),
        (cfg.env.max_tool_output_chars < 1, "env.max_tool_output_chars must be >= 1"),
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
            f"({t.prompts_per_step}) divisible by algo.num_minibatches, or set algo.num_minibatches "
            f"(the '{a.name}' preset uses {ALGO_PRESETS[a.name]['num_minibatches']})."
        )
    _check_server(cfg)
    if a.resolved_advantage == "gae" and a.name != "ppo":
        raise ConfigError("algo.advantage='gae' needs a value model: set algo.name=ppo.")
    if a.name == "ppo" or a.needs_critic:
        _check_ppo(a)
    if a.supervision == "process":
        _check_process(cfg)
    warn_config(cfg)


LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def _check_server(cfg: Config) -> None:
    """rollout.mode=server's settings, checked before any model loads (docs/server_mode.md)."""
    r = cfg.rollout
    if r.mode == "colocated":
        set_here = [k for k in ("server_url", "max_staleness") if getattr(r, k) != _default(type(r), k)]
        if set_here:
            raise ConfigError(
                f"rollout.{set_here[0]} needs rollout.mode=server (a vLLM server beside the trainer): set "
                "rollout.mode=server, or leave it out"
            )
        return
    checks = [
        (r.engine != "vllm", "rollout.mode=server runs vLLM's server: set rollout.engine=vllm (its vllm.* settings start it)"),
        (r.max_staleness < 0, "rollout.max_staleness must be >= 0 (0 = synchronous)"),
        (r.sync_timeout_s <= 0, "rollout.sync_timeout_s must be > 0 (seconds per server call)"),
        (r.server_start_timeout_s <= 0, "rollout.server_start_timeout_s must be > 0"),
        (r.sync_bucket_mb <= 0, "rollout.sync_bucket_mb must be > 0 (MB per weight bucket)"),
        (not 0 <= r.server_port < 65536, "rollout.server_port must be in 0..65535 (0 = a free port)"),
        (
            cfg.model.lora.enabled and cfg.model.lora.r > 512,
            "rollout.mode=server loads LoRA adapters of rank <= 512 (vLLM's largest max_lora_rank): lower model.lora.r",
        ),
    ]
    for bad, message in checks:
        if bad:
            raise ConfigError(message)
    url = urlsplit(r.server_url) if r.server_url else None
    if url is not None and (url.scheme not in ("http", "https") or not url.hostname):
        raise ConfigError(f"rollout.server_url={r.server_url!r} is not an http(s) URL: e.g. http://127.0.0.1:8000")
    for key, host in (("server_url", url.hostname if url else None), ("server_host", r.server_host)):
        if host is not None and host not in LOOPBACK and not (r.allow_remote and os.environ.get(r.api_key_env)):
            raise ConfigError(
                f"rollout.{key} names {host}, not loopback: vLLM's RL endpoints let whoever reaches them run "
                f"engine methods, so a remote server needs rollout.allow_remote=true and an API key in "
                f"${r.api_key_env} (rollout.api_key_env)"
            )


def inert_settings(cfg: Config) -> list[str]:
    """Settings that are valid but cannot act, one sentence each with the fix (logged once when a config loads).

    A preset's own values are flagged only where the preset cannot make them act either (DeepSeekMath's
    GRPO clip at mu=1 is the paper's recipe, not the user's choice); a value the user chose is flagged.
    """
    a, out = cfg.algo, []
    if a.ratio_is_one:
        out += [_RATIO_IS_ONE.format(what=what) for what in _inert_clips(a)]
    if not a.dynamic_sampling and a.max_sampling_rounds != _default(AlgoConfig, "max_sampling_rounds"):
        out.append(
            f"algo.max_sampling_rounds={a.max_sampling_rounds} has no effect without dynamic sampling: set "
            "algo.dynamic_sampling=true (DAPO) or leave it out"
        )
    if a.rollout_correction == "none":
        changed = [
            f"algo.{k}={getattr(a, k)}"
            for k in ("rollout_correction_level", "rollout_correction_cap")
            if getattr(a, k) != _default(AlgoConfig, k)
        ]
        if changed:
            out.append(
                f"{' and '.join(changed)} have no effect with algo.rollout_correction=none: set "
                "algo.rollout_correction=tis (or mis) to correct the sampler / trainer mismatch"
            )
    if a.beta == 0 and a.kl_estimator != a.preset["kl_estimator"]:
        out.append(f"algo.kl_estimator={a.kl_estimator} has no effect with algo.beta=0 (no KL term): set algo.beta > 0")
    if a.importance_level == "sequence" and a.loss_agg == "token-mean":
        out.append(
            "algo.importance_level=sequence (GSPO) with algo.loss_agg=token-mean weighs each sequence's ratio by "
            "its length; GSPO's objective averages over sequences: set algo.loss_agg=seq-mean-token-mean"
        )
    return out


_RATIO_IS_ONE = (
    "algo.mu=1 and algo.num_minibatches=1 make the importance ratio exactly 1 (the policy does not move "
    "before its batch is used up), so {what} cannot act; set algo.num_minibatches > 1 or algo.mu > 1 "
    "(DAPO: 16 minibatches, GSPO: 4)"
)


def _default(cls, name: str):
    return next(f.default for f in fields(cls) if f.name == name)


def _inert_clips(a: AlgoConfig) -> list[str]:
    """What a ratio of exactly 1 leaves inert, each named by its own setting."""
    out = []
    clips = f"algo.clip_low={a.clip_low:g}, algo.clip_high={a.clip_high:g}"
    chosen = a.clip_low != a.preset["clip_low"] or a.clip_high != a.preset.get("clip_high", a.preset["clip_low"])
    if a.policy_loss == "cispo":
        out.append(f"CISPO's IS-weight clip ({clips}; it is REINFORCE with token-mean here)")
    elif a.importance_level == "sequence":
        out.append(f"GSPO's sequence-level clip ({clips})")
    elif a.clip_high != a.clip_low:
        out.append(f"the ratio clip with Clip-Higher ({clips})")
    elif chosen:
        out.append(f"the symmetric ratio clip (algo.clip_low=algo.clip_high={a.clip_low:g})")
    if a.policy_loss == "clip" and a.dual_clip is not None:
        out.append(f"the dual clip (algo.dual_clip={a.dual_clip:g})")
    if a.needs_critic and a.value_clip is not None:
        out.append(f"the value clip (algo.value_clip={a.value_clip:g}: the value model does not move either)")
    return out


def _check_process(cfg: Config) -> None:
    a, spec = cfg.algo, cfg.reward.process
    if cfg.env.name is not None and spec is not None:
        raise ConfigError(
            "reward.process is set, but with env.name the steps of process supervision are the episode's "
            "turns, scored by the environment's per-turn rewards: remove reward.process (docs/multiturn.md)"
        )
    if cfg.env.name is None and (spec is None or not spec.name):
        raise ConfigError(
            "algo.supervision=process needs reward.process, e.g. "
            "reward.process={name: 'my_module:step_scores', delimiter: '\\n'} (or env.name: the steps are turns)"
        )
    if spec is not None and not spec.delimiter:
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
        (
            a.value_clip is not None and a.value_clip <= 0,
            "algo.value_clip must be > 0 (0.2), or null for no clip",
        ),
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
