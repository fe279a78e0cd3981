"""Every check of a config, in one place: finite numbers, one range table, the checks across fields, and
the one channel for valid settings that do less than they say.

``Config.__post_init__`` runs them, so a config built in Python is checked as one read from YAML is:

1. ``check_finite``: the generic walk visits every numeric field of every section (nested specs and tuples
   included) and names the dotted key of a NaN or infinity; a NaN compares False with everything, so
   without it ``algo.beta=nan`` passed ``beta < 0`` and ran with no KL at all.
2. ``check_ranges``: ``range_table``, one row per setting (or pair) with its allowed range and the message.
3. ``check_cross_fields``: combinations of settings (group size, greedy sampling, minibatch split, GAE,
   process supervision) and the prompt template.
4. ``warn_config`` (config/inert.py): every note of ``inert_settings`` as a ``ConfigWarning``. Nothing fails;
   the message says what to change.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from grpolab.config.algo_section import ALGO_PRESETS, GROUP_BASELINES
from grpolab.config.env_checks import check_env_kwargs
from grpolab.config.resolve import config_fields
from grpolab.config.server_checks import check_server
from grpolab.config.templates import resolve_template
from grpolab.errors import ConfigError

if TYPE_CHECKING:
    from grpolab.config.root import Config


class ConfigWarning(UserWarning):
    """A setting that silently does less than it says; the message says what to change."""




def numeric_fields(obj: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """(dotted key, value) of every int / float reachable from a config dataclass (bools excluded)."""
    if dataclasses.is_dataclass(obj):
        for f in config_fields(obj):
            yield from numeric_fields(getattr(obj, f.name), f"{prefix}{f.name}.")
    elif isinstance(obj, tuple | list):
        for i, v in enumerate(obj):
            yield from numeric_fields(v, f"{prefix.rstrip('.')}[{i}].")
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from numeric_fields(v, f"{prefix}{k}.")
    elif isinstance(obj, numbers.Real) and not isinstance(obj, bool):
        yield prefix.rstrip("."), obj


INT_LIMIT = 1 << 63
"""Integers of a config must lie in (-2**63, 2**63): torch's generators and counters are 64-bit."""

SEED_LIMIT = INT_LIMIT - (1 << 16)
"""Room above ``seed`` for the per-rank and per-purpose offsets (seed + rank, seed + 2)."""


def check_finite(cfg: Any) -> None:
    """Every float finite, every int within 64 bits (math.isfinite of a huge int raises OverflowError)."""
    seed = getattr(cfg, "seed", 0)
    if not -SEED_LIMIT < seed < SEED_LIMIT:
        raise ConfigError(f"seed={seed} is too large: give a seed of at most 63 bits (|seed| < 2**63 - 65536)")
    for key, value in numeric_fields(cfg):
        if isinstance(value, int) and not -INT_LIMIT < value < INT_LIMIT:
            raise ConfigError(
                f"config key '{key}' is an integer of {len(str(abs(value)))} digits, beyond 64 bits; give a "
                "smaller number"
            )
        if not math.isfinite(value):
            raise ConfigError(f"config key '{key}' is {value!r}; give a finite number")




def range_table(cfg: Config) -> list[tuple[bool, str]]:
    """(out of range, message) for every setting with a range, section by section; the first hit is raised.

    The PPO rows (gamma .. value_init_path) apply only where a value model is trained (algo.name=ppo or
    algo.advantage=gae)."""
    m, d, r, a, o, t, e, lg = cfg.model, cfg.data, cfg.rollout, cfg.algo, cfg.optim, cfg.train, cfg.eval, cfg.log
    env, sft, critic = cfg.env, cfg.sft, a.name == "ppo" or a.needs_critic
    return [
        (m.lora.r < 1 or m.lora.alpha <= 0, "model.lora.r must be >= 1 and model.lora.alpha > 0"),
        (not 0 <= m.lora.dropout < 1, "model.lora.dropout must be in [0, 1)"),
        (d.size < 1, "data.size must be >= 1"),
        (d.eval_size < 0, "data.eval_size must be >= 0 (0 = no held-out set)"),
        (d.max_prompt_length < 1, "data.max_prompt_length must be >= 1"),
        (
            r.max_batch_sequences is not None and r.max_batch_sequences < 1,
            "rollout.max_batch_sequences must be >= 1, or null for no limit",
        ),
        (a.eps <= 0, "algo.eps must be > 0 (1e-4): it keeps a zero-std group from dividing by zero"),
        (a.ref_reset_every < 0, "algo.ref_reset_every must be >= 0 (0 = never)"),
        (not 0 < a.ref_mixup_alpha <= 1, "algo.ref_mixup_alpha must be in (0, 1] (1 = replace the reference; TR-DPO: 0.6)"),
        (o.weight_decay < 0, "optim.weight_decay must be >= 0"),
        (any(not 0 <= b < 1 for b in o.betas), "optim.betas must both be in [0, 1) (AdamW: 0.9, 0.99)"),
        (o.max_grad_norm < 0, "optim.max_grad_norm must be >= 0 (0 = no clip)"),
        (o.warmup_steps < 0, "optim.warmup_steps must be >= 0"),
        (not 0.0 <= o.min_lr_ratio < 1.0, "optim.min_lr_ratio must be in [0, 1) (a fraction of optim.lr)"),
        (t.max_no_signal_steps < 0, "train.max_no_signal_steps must be >= 0 (0 = never stop)"),
        (
            not 0 <= t.max_failed_group_share <= 1,
            "train.max_failed_group_share must be in [0, 1] (a share of the step's groups; 0.5 = stop when more "
            "than half were dropped for failed samples, 1 = never stop for it)",
        ),
        (cfg.reward.max_retries < 0, "reward.max_retries must be >= 0 (0 = no retry)"),
        (env.max_retries < 0, "env.max_retries must be >= 0 (0 = no retry)"),
        (e.every < 0 or e.max_prompts < 0, "eval.every and eval.max_prompts must be >= 0"),
        (e.temperature < 0, "eval.temperature must be >= 0 (0 = greedy)"),
        (lg.samples_every < 0, "log.samples_every must be >= 0 (0 = never)"),
        (cfg.reward.dry_run_examples < 0, "reward.dry_run_examples must be >= 0 (0 = skip)"),
        (sft.lr <= 0 or sft.weight_decay < 0, "sft.lr must be > 0 and sft.weight_decay >= 0"),
        (sft.dev_size < 1, "sft.dev_size must be >= 1"),
        (r.num_generations < 1, "rollout.num_generations must be >= 1"),
        (t.prompts_per_step < 1, "train.prompts_per_step must be >= 1"),
        (t.num_steps < 0, "train.num_steps must be >= 0"),
        (t.micro_batch_size != "auto" and t.micro_batch_size < 1, "train.micro_batch_size must be >= 1 (or auto)"),
        (t.sequence_parallel < 1, "train.sequence_parallel must be >= 1 (1 = off; N: N ranks split each sequence)"),
        (
            t.sequence_parallel > 1 and r.max_staleness > 0,
            "train.sequence_parallel > 1 does not run with rollout.max_staleness > 0 (the background sampler's "
            "collectives span every rank): set rollout.max_staleness=0",
        ),
        (t.dist_timeout_s <= 0, "train.dist_timeout_s must be > 0 (seconds a collective waits for the other ranks)"),
        (
            t.max_tokens_per_micro_batch is not None and t.max_tokens_per_micro_batch < 1,
            "train.max_tokens_per_micro_batch must be >= 1 (padded tokens per forward), or null for rows only",
        ),
        (r.max_completion_length < 1, "rollout.max_completion_length must be >= 1"),
        (r.temperature < 0, "rollout.temperature must be >= 0 (0 = greedy)"),
        (not 0 < r.top_p <= 1, "rollout.top_p must be in (0, 1]"),
        (r.top_k < 0, "rollout.top_k must be >= 0 (0 = off)"),
        (not 0 <= r.min_p <= 1, "rollout.min_p must be in [0, 1] (0 = off; typical: 0.01-0.2)"),
        (not r.repetition_penalty > 0, "rollout.repetition_penalty must be > 0 (1.0 = off; > 1 discourages repeats)"),
        (a.mu < 1, "algo.mu must be >= 1 (1 = a single update per generation batch)"),
        (a.num_minibatches < 1, "algo.num_minibatches must be >= 1"),
        (a.beta < 0, "algo.beta must be >= 0 (0 = no KL and no reference model)"),
        (a.clip_low < 0 or (a.clip_high < 0 and not _cispo_cap_under_one(a)),
         "algo.clip_low and algo.clip_high must be >= 0 (cispo: clip_high down to > -1, an IS-weight cap 1 + clip_high "
         "under 1, with clip_low >= -clip_high)"),
        (a.dual_clip is not None and a.dual_clip <= 1, "algo.dual_clip must be > 1 (verl uses 3.0), or null"),
        (a.max_sampling_rounds < 1, "algo.max_sampling_rounds must be >= 1 (verl: 10)"),
        (a.rollout_correction_cap <= 0, "algo.rollout_correction_cap must be > 0 (TIS: 2.0)"),
        (a.entropy_coef < 0, "algo.entropy_coef must be >= 0 (0 = no entropy bonus)"),
        (
            a.loss_agg == "batch-token-mean" and (a.loss_agg_batch_rows is None or a.loss_agg_batch_rows < 1),
            "algo.loss_agg=batch-token-mean needs algo.loss_agg_batch_rows >= 1 (the rows of each normalising batch; "
            "TRL's bnpo: per_device_train_batch_size)",
        ),
        (
            a.entropy_adaptive and not 0 <= a.entropy_coef_min <= a.entropy_coef <= a.entropy_coef_max,
            "algo.entropy_adaptive needs 0 <= algo.entropy_coef_min <= algo.entropy_coef <= algo.entropy_coef_max "
            "(TRL: 0 and 1; entropy_coef is the starting coefficient)",
        ),
        (a.entropy_adaptive and a.entropy_coef_delta <= 0, "algo.entropy_coef_delta must be > 0 (TRL: 0.005)"),
        (
            a.policy_loss == "cispo" and a.dual_clip is not None,
            "algo.policy_loss=cispo clips an IS weight and has no PPO min for a dual clip to cap: set algo.dual_clip=null",
        ),
        (
            a.advantage == "gdpo" and a.kl_in == "reward",
            "algo.advantage=gdpo normalises each reward function apart, so no summed reward takes the KL: set "
            "algo.kl_in=loss",
        ),
        (a.policy_loss == "sapo" and a.dual_clip is not None, "algo.policy_loss=sapo has no hard clip: set algo.dual_clip=null"),
        (
            a.policy_loss == "vespo"
            and (a.importance_level != "token" or a.dual_clip is not None or a.rollout_correction_level != "token"),
            "algo.policy_loss=vespo builds its own sequence weight from the token ratios (and per-token rollout "
            "weights, as TRL): set algo.importance_level=token, algo.rollout_correction_level=token, algo.dual_clip=null",
        ),
        (
            min(a.vespo_k_pos, a.vespo_lambda_pos, a.vespo_k_neg, a.vespo_lambda_neg) < 0,
            "algo.vespo_k_pos, _lambda_pos, _k_neg and _lambda_neg must be >= 0 (TRL: 2, 3, 3, 2)",
        ),
        (
            a.sapo_temperature_pos <= 0 or a.sapo_temperature_neg <= 0,
            "algo.sapo_temperature_pos and algo.sapo_temperature_neg must be > 0 (TRL: 1.0 and 1.05)",
        ),
        (
            a.off_policy_mask_threshold is not None and a.off_policy_mask_threshold < 0,
            "algo.off_policy_mask_threshold must be >= 0 nats per token (DeepSeek-V3.2, TRL: e.g. 0.5), or null for off",
        ),
        (
            not 0 <= a.top_entropy_quantile <= 1,
            "algo.top_entropy_quantile must be in [0, 1] (the 80/20 rule: 0.2; 1.0 = every token)",
        ),
        (o.lr <= 0, "optim.lr must be > 0"),
        (e.num_samples < 1, "eval.num_samples must be >= 1"),
        (any(not 0 < k <= e.num_samples for k in e.ks), "eval.ks must be in 1..eval.num_samples"),
        (e.prompts_per_batch < 1, "eval.prompts_per_batch must be >= 1"),
        (sft.steps < 0 or sft.batch_size < 1, "sft.steps must be >= 0 and sft.batch_size >= 1"),
        (sft.check_every < 1, "sft.check_every must be >= 1"),
        ("{answer}" not in sft.completion_format, "sft.completion_format must contain {answer}"),
        (lg.keep_last < 1, "log.keep_last must be >= 1"),
        (lg.checkpoint_every < 0, "log.checkpoint_every must be >= 0 (0 = only at the end)"),
        (
            r.kv_cache_budget_mb is not None and r.kv_cache_budget_mb <= 0,
            "rollout.kv_cache_budget_mb must be > 0 (MB for the sampler's KV cache), or null for a share of free memory",
        ),
        (env.max_turns < 1, "env.max_turns must be >= 1"),
        (env.max_episode_tokens < 1, "env.max_episode_tokens must be >= 1"),
        (env.tool_timeout_s <= 0, "env.tool_timeout_s must be > 0 (seconds per tool call)"),
        (env.step_timeout_s <= 0, "env.step_timeout_s must be > 0 (seconds per environment turn)"),
        (
            cfg.rollout.max_logprob_gap is not None and not cfg.rollout.max_logprob_gap > 0,
            "rollout.max_logprob_gap must be > 0 (nats per token) or null (never stop)",
        ),
        (env.max_tool_output_chars < 1, "env.max_tool_output_chars must be >= 1"),
        (t.max_bad_steps < 0, "train.max_bad_steps must be >= 0 (0 = skip bad updates but never stop)"),
        (cfg.reward.timeout_s <= 0, "reward.timeout_s must be > 0 (seconds per reward call on a batch)"),
        (critic and not 0 <= a.gamma <= 1, "algo.gamma must be in [0, 1] (1.0 = undiscounted, as TRL and verl)"),
        (critic and not 0 <= a.lam <= 1, "algo.lam must be in [0, 1] (DeepSeek-R1 supp. A.3: 1.0; TRL: 0.95)"),
        (critic and a.vf_coef <= 0, "algo.vf_coef must be > 0 (TRL: 0.1)"),
        (
            critic and a.value_clip is not None and a.value_clip <= 0,
            "algo.value_clip must be > 0 (0.2), or null for no clip",
        ),
        (critic and a.value_lr is not None and a.value_lr <= 0, "algo.value_lr must be > 0, or null for optim.lr"),
        (
            critic and a.critic_warmup_steps < 0,
            "algo.critic_warmup_steps must be >= 0 (0 = no critic warm-up)",
        ),
        (
            critic and a.value_init == "reward_model" and not a.value_init_path,
            "algo.value_init=reward_model needs algo.value_init_path, the reward model's folder or hub id "
            "(or use algo.value_init=policy)",
        ),
    ]


def check_ranges(cfg: Config) -> None:
    """Every number finite and every setting in its range (``range_table``); ConfigError naming the key."""
    check_finite(cfg)
    for bad, message in range_table(cfg):
        if bad:
            raise ConfigError(message)




def check_cross_fields(cfg: Config) -> None:
    """Combinations of settings: greedy groups, the template, group size, the minibatch split, GAE's value
    model, process supervision. Runs after ``check_ranges`` (and after the preset's minibatches are fitted)."""
    a, r, t = cfg.algo, cfg.rollout, cfg.train
    if r.temperature == 0 and a.advantage in GROUP_BASELINES and r.num_generations > 1:
        raise ConfigError(
            f"rollout.temperature=0 samples greedily, so the {r.num_generations} completions of a group are "
            f"identical and algo '{a.name}' gets zero advantage everywhere: nothing would be learned. "
            "Use a temperature > 0 (1.0 is usual)"
        )
    try:
        resolve_template(cfg.data.template)
    except ValueError as err:
        raise ConfigError(f"data.template: {err}") from err
    needs_group = a.advantage in GROUP_BASELINES
    if (needs_group or a.dynamic_sampling) and r.num_generations < 2:
        raise ConfigError(
            f"rollout.num_generations={r.num_generations}: algo '{a.name}' compares completions within a "
            "group, so it needs at least 2 per prompt. Set rollout.num_generations >= 2 (DeepSeekMath used 64)."
        )
    n = cfg.completions_per_step
    if n % a.num_minibatches or (n // a.num_minibatches) % r.num_generations:
        raise ConfigError(
            f"algo.num_minibatches={a.num_minibatches} must split the {n} completions per step into whole "
            f"groups of rollout.num_generations={r.num_generations}: make train.prompts_per_step "
            f"({t.prompts_per_step}) divisible by algo.num_minibatches, or set algo.num_minibatches "
            f"(the '{a.name}' preset uses {ALGO_PRESETS[a.name]['num_minibatches']})."
        )
    if a.advantage == "gae" and a.name != "ppo":
        raise ConfigError("algo.advantage='gae' needs a value model: set algo.name=ppo.")
    _check_attention(cfg)
    _check_lora_parameters(cfg)
    _check_compile(cfg)
    check_env_kwargs(cfg.env.name, cfg.env.kwargs)
    check_server(cfg)
    if a.supervision == "process":
        _check_process(cfg)


def _check_lora_parameters(cfg: Config) -> None:
    """model.lora.target_parameters (peft's ParamWrapper): what adapts something, and where it is supported."""
    lora = cfg.model.lora
    if lora.enabled and not lora.target_modules and not lora.target_parameters:
        raise ConfigError("model.lora adapts nothing: give model.lora.target_modules (or target_parameters)")
    if not (lora.enabled and lora.target_parameters):
        return
    if cfg.rollout.engine != "hf":
        raise ConfigError(
            f"model.lora.target_parameters={list(lora.target_parameters)} needs rollout.engine=hf: grpolab hands "
            "vLLM module adapters (or merges them into the weights it syncs), which an adapter on parameters is not"
        )
    if cfg.train.parallel == "fsdp":
        raise ConfigError(
            "model.lora.target_parameters with train.parallel=fsdp is not supported: grpolab's FSDP2 sharding of a "
            "LoRA policy is built for module adapters, and peft's ParamWrapper parametrizes the stacked expert weight "
            "that FSDP2 would shard; use train.parallel=ddp"
        )


def _check_compile(cfg: Config) -> None:
    """model.compile compiles the decoder layers in place: not yet checked under FSDP2's per-layer hooks or with
    the sequence-parallel attention's all-to-alls inside a compiled layer."""
    if not cfg.model.compile:
        return
    if cfg.train.parallel == "fsdp":
        raise ConfigError("model.compile=true with train.parallel=fsdp is not supported yet: use train.parallel=ddp, or model.compile=false")
    if cfg.train.sequence_parallel > 1:
        raise ConfigError(
            f"model.compile=true with train.sequence_parallel={cfg.train.sequence_parallel} is not supported yet: "
            "set model.compile=false"
        )


ATTENTION = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
"""model.attn_implementation's names (transformers'), besides a kernels-hub id ("org/name")."""
FLASH_PACKAGES = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}


def _check_attention(cfg: Config) -> None:
    """model.attn_implementation names an implementation; flash needs CUDA (checked again, with its package,
    by ``check_attention_runtime`` before the model loads)."""
    m = cfg.model
    name = m.attn_implementation
    if name is None:
        return
    if name not in ATTENTION and "/" not in name:
        raise ConfigError(
            f"model.attn_implementation={name!r} is not an attention implementation: use one of "
            f"{', '.join(ATTENTION)}, a kernels-hub id such as kernels-community/flash-attn, or null (transformers' default)"
        )
    if name in FLASH_PACKAGES and m.device == "cpu":
        raise ConfigError(f"model.attn_implementation={name} runs on CUDA only: use sdpa with model.device=cpu")


def check_attention_runtime(model_cfg, device_type: str) -> None:
    """Flash attention on this machine (``model_cfg``: the model section): a CUDA device and its package, and
    for a kernels-hub id the ``kernels`` package that transformers loads it with, before any model loads."""
    import importlib.util

    name = model_cfg.attn_implementation
    if name and "/" in name and importlib.util.find_spec("kernels") is None:
        raise ConfigError(
            f"model.attn_implementation={name} is a kernels-hub id, which transformers loads with the `kernels` "
            "package, and it is not installed: pip install kernels, or use sdpa"
        )
    package = FLASH_PACKAGES.get(name or "")
    if package is None:
        return
    if device_type != "cuda":
        raise ConfigError(f"model.attn_implementation={name} runs on CUDA only and this run is on {device_type}: use sdpa")
    # without the package transformers falls back to the kernels hub's build when `kernels` is installed
    if importlib.util.find_spec(package) is None and importlib.util.find_spec("kernels") is None:
        raise ConfigError(
            f"model.attn_implementation={name} needs the {package} package (or `kernels`, whose hub build "
            f"transformers then uses), and neither is installed: pip install "
            f"{'flash-attn' if package == 'flash_attn' else 'flash-attn-3'} --no-build-isolation, or use sdpa"
        )


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
    if a.advantage != "grpo" or a.kl_in != "loss":
        raise ConfigError(
            "algo.supervision=process implements GRPO with process supervision (DeepSeekMath Sec. 4.1.3): "
            "use algo.name=grpo (or dapo) with algo.advantage=grpo and the KL in the loss"
        )


def _cispo_cap_under_one(a) -> bool:
    """CISPO's weight clip(ratio, 1 - clip_low, 1 + clip_high) with a cap under 1 (TRL's loss_type=cispo with
    epsilon_high <= 1 caps the weight there): a non-empty range above 0."""
    return a.policy_loss == "cispo" and a.clip_high > -1 and a.clip_low >= -a.clip_high
