"""What GRPOTrainer's ``args`` (and its other arguments) become: the nested dict of config sections it is
built from, from a grpolab Config, a dict of sections or dotted keys, a YAML path or TRL's GRPOConfig
(converted by ``grpolab convert-trl``'s rules); the defaults that differ under the TRL-shaped API; the
config's warnings, logged as TRL logs its own; and the Config built from that dict with the rewards and the
dataset given (``assemble``).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import warnings
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from grpolab.api_data import dataset_rows, stream_limit
from grpolab.api_rewards import as_list, build_reward_funcs, recorded_spec
from grpolab.config import (
    Config,
    ConfigWarning,
    DataConfig,
    TrainConfig,
    config_from_dict,
    config_to_dict,
    load_config,
    user_settings,
)
from grpolab.data import DataError, examples_from_rows
from grpolab.envs.trl_env import env_methods, env_reward, register, unregister
from grpolab.errors import ConfigError
from grpolab.rewards import TrlReward, WeightedReward
from grpolab.rewards.trl_style import check_columns
from grpolab.trl.convert import TrlConversion, convert_trl
from grpolab.types import Example

log = logging.getLogger(__name__)


@contextlib.contextmanager
def config_warnings_logged() -> Iterator[None]:
    """Each setting that does less than it says (config/checks.py), found while the config is built, logged once
    as a warning, as TRL logs its own, rather than raised as a ConfigWarning: a script's logging (or a test's
    caplog) sees it. Other warnings pass on as they came."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for message in dict.fromkeys(str(w.message) for w in caught if issubclass(w.category, ConfigWarning)):
        log.warning("%s", message)
    for w in caught:  # outside the block: they meet the caller's filters, as they would have
        if not issubclass(w.category, ConfigWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def no_stop_without_signal(raw: dict[str, Any]) -> None:
    """train.max_no_signal_steps=0 unless the args set it: TRL's trainer goes on through steps without
    learning signal (all rewards of every group equal), so a script written for it is warned, not stopped
    (runtime/guards.py). A Config object or YAML file holds every field, so it keeps its own value."""
    train = raw.get("train", {})
    if not isinstance(train, Mapping) or "max_no_signal_steps" not in train:
        set_key(raw, "train", "max_no_signal_steps", 0)


def _names_data(data: Mapping[str, Any]) -> bool:
    return data.get("source", DataConfig.source) not in ("jsonl", "hf") or bool(data.get("path"))


def check_data_named(data: Mapping[str, Any]) -> None:
    """train_dataset=None takes the config's data section; one that names no data is refused here, as TRL
    refuses a missing train_dataset, before any model loads."""
    if not _names_data(data):
        raise DataError(
            "`train_dataset` is required unless an `environment_factory` owns the data: it is None and the config "
            "names no data (data.path is empty): give train_dataset (a datasets.Dataset or a list of dicts), or "
            "data.path, or a built-in data.source such as arithmetic"
        )


ENV_PROMPT = ({"role": "user", "content": ""},)
"""TRL's prompt of a row an environment owns (no train_dataset, or a routing row without one): an empty user
turn, to which reset()'s observation is appended."""


def environment_rows(raw: Mapping[str, Any], args: Any, train_dataset: Any, environment_factory: Any) -> Any:
    """TRL's environment-owned data: without a train_dataset (and no data in the config), one environment_factory
    owns the data, its reset() returning each prompt; ``max_steps`` (train.num_steps) sets the length, and the
    rows are ``train.prompts_per_step`` empty user turns. A dataset's row without a prompt (a dict of factories
    routing by ``environment``) gets one too. Otherwise ``train_dataset`` as given."""
    field = raw.get("data", {}).get("prompt_field", DataConfig.prompt_field)
    if environment_factory is None or (train_dataset is None and _names_data(raw.get("data", {}))):
        return train_dataset
    if train_dataset is not None:
        rows = dataset_rows(train_dataset, limit=stream_limit(raw, train_dataset))
        return [row if field in row else {**row, field: list(ENV_PROMPT)} for row in rows]
    if isinstance(environment_factory, Mapping):
        raise DataError(
            "a dict `environment_factory` (multiple environments) requires a `train_dataset` with an `environment` "
            "column to route each example to its environment: give one, or a single environment factory"
        )
    if _is_trl_config(args) and args.max_steps <= 0:
        raise ConfigError(
            "training without a train_dataset (the environment owns the data and returns the prompt from reset()) "
            "needs `max_steps` > 0 to set its length: GRPOConfig(max_steps=...)"
        )
    count = raw.get("train", {}).get("prompts_per_step", TrainConfig.prompts_per_step)
    return [{field: list(ENV_PROMPT)} for _ in range(count)]


def _raw_config(args: Any) -> dict[str, Any]:
    """A nested dict of config sections from any form ``args`` may take."""
    if args is None:
        return {}
    if isinstance(args, Config):  # what the user set, so a preset left unset stays the preset's to fill
        settings = user_settings(args)
        return config_to_dict(args) if settings is None else settings
    if isinstance(args, str | os.PathLike):
        return dict(load_config(Path(args)).settings)
    if not isinstance(args, Mapping):
        raise ConfigError(f"args is a {type(args).__name__}: give a grpolab Config, a dict, a YAML path or TRL's GRPOConfig")
    raw: dict[str, Any] = {}
    for key, value in args.items():
        if not isinstance(key, str):
            raise ConfigError(f"config key {key!r} must be a str")
        *sections, leaf = key.split(".")
        node = raw
        for section in sections:
            node = node.setdefault(section, {})
            if not isinstance(node, dict):
                raise ConfigError(f"config key {key!r}: {section!r} is given both as a value and as a section")
        node[leaf] = _merge(node.get(leaf), copy.deepcopy(value))
    return raw


def raw_args(args: Any, train_dataset: Any, reward_weights):
    """The config sections, the reward weights (a GRPOConfig's own when the call gives none) and, for TRL's
    GRPOConfig, its conversion."""
    if not _is_trl_config(args):
        return _raw_config(args), reward_weights, None
    conversion = _convert_trl_args(args, train_dataset)
    if reward_weights is None and args.reward_weights is not None:
        reward_weights = args.reward_weights
    return conversion.config_dict(), reward_weights, conversion


def assemble(
    raw: dict[str, Any], reward_funcs, reward_weights, train_dataset, tokenizers=None
) -> tuple[Config, list[WeightedReward] | None, list[Example] | None]:
    """The config, with the rewards and examples that replace its reward and data sections (None: keep them)."""
    rewards = None
    if reward_funcs is not None:
        if raw.get("reward", {}).get("functions"):
            raise ConfigError(
                "the rewards are given twice, as reward_funcs and in the config's reward.functions: keep one"
            )
        rewards = build_reward_funcs(reward_funcs, reward_weights, tokenizers)
        tokenizers = tokenizers or [None] * len(rewards)
        specs = [recorded_spec(f, r, t) for f, r, t in zip(as_list(reward_funcs), rewards, tokenizers, strict=True)]
        set_key(raw, "reward", "functions", specs)
    elif reward_weights is not None:
        raise ConfigError("reward_weights needs reward_funcs (in a config, give each reward.functions entry a weight)")
    rows = None
    if train_dataset is None:
        check_data_named(raw.get("data", {}))
    else:
        if raw.get("data", {}).get("path"):
            raise ConfigError("the data is given twice, as train_dataset and in the config's data.path: keep one")
        rows = dataset_rows(train_dataset, limit=stream_limit(raw, train_dataset))
        default = DataConfig.answer_field
        if raw.get("data", {}).get("answer_field", default) == default and not any(default in r for r in rows):
            set_key(raw, "data", "answer_field", None)  # TRL's datasets have no answer column
    cfg = config_from_dict(raw)  # each setting that does less than it says warns (config/checks.py)
    examples = None if rows is None else examples_from_rows(rows, cfg.data, origin="train_dataset")
    if rows is not None and any(isinstance(r.reward, TrlReward) for r in rewards or ()):
        check_columns(list(dict.fromkeys(k for r in rows for k in r)), "train_dataset")
    return cfg, rewards, examples


def _is_trl_config(args: Any) -> bool:
    """TRL's GRPOConfig (or a subclass), told by its class without importing TRL."""
    return any(c.__name__ == "GRPOConfig" and c.__module__.startswith("trl") for c in type(args).__mro__)


def _convert_trl_args(args: Any, train_dataset: Any) -> TrlConversion:
    """TRL's GRPOConfig through convert-trl's rules; its report is logged as ``grpolab convert-trl`` writes it.

    The world size is torchrun's (``WORLD_SIZE``, as ``accelerate launch`` sets it for TRL): TRL's batch sizes
    are per device. The dataset's length turns ``num_train_epochs`` into ``train.num_steps``.
    """
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        world = 1
    rows = len(train_dataset) if train_dataset is not None and hasattr(train_dataset, "__len__") else None
    try:
        conversion = convert_trl(args, num_processes=world, dataset_rows=rows or None)
    except ConfigError as err:
        raise ConfigError(f"args (TRL's GRPOConfig; world size {world}, from WORLD_SIZE as torchrun sets it): {err}") from err
    for title, items in (("differs from TRL", conversion.notes), ("ignored (not applicable)", conversion.ignored)):
        for item in items:
            log.info("args (TRL's GRPOConfig) %s: %s", title, item)
    for item in conversion.todo:
        if not item.startswith(tuple(_GIVEN_BY_THE_CALL)):
            log.warning("args (TRL's GRPOConfig): to fill in: %s", item)
    return conversion


_GIVEN_BY_THE_CALL = ("model.name_or_path", "data.source", "reward.functions")
"""convert-trl's to-fill items that GRPOTrainer's own arguments (model, train_dataset, reward_funcs) fill."""


def _merge(old: Any, new: Any) -> Any:
    if isinstance(old, dict) and isinstance(new, Mapping):
        return {**old, **{k: _merge(old.get(k), v) for k, v in new.items()}}
    return new


def set_key(raw: dict[str, Any], section: str, key: str, value: Any) -> None:
    node = raw.setdefault(section, {})
    if not isinstance(node, dict):
        raise ConfigError(f"config section {section!r} must be a mapping, got {type(node).__name__}")
    node[key] = value


def model_source(obj: Any, arg: str) -> str:
    if isinstance(obj, str | os.PathLike):
        return os.fspath(obj)
    raise ConfigError(f"{arg} is a {type(obj).__name__}: give a tokenizer object, its folder or hub id")


def lora_targets(lora: Any) -> dict[str, Any]:
    """A peft LoraConfig's targets as model.lora's: the modules (None: "all-linear", as grpolab has always read
    it; none where parameters alone are targeted, as peft reads it) and peft's target_parameters."""
    params = sorted(getattr(lora, "target_parameters", None) or ())
    targets = lora.target_modules
    if targets is None:
        targets = [] if params else "all-linear"
    elif not isinstance(targets, str):
        targets = sorted(targets)
    return {"target_modules": targets, "target_parameters": params}


def lora_section(peft_config: Any) -> dict[str, Any]:
    """A peft.LoraConfig as the model.lora section."""
    if not all(hasattr(peft_config, a) for a in ("r", "lora_alpha", "lora_dropout", "target_modules")):
        raise ConfigError(f"peft_config is a {type(peft_config).__name__}: grpolab trains LoRA adapters; give a peft.LoraConfig")
    return {
        "enabled": True,
        "r": peft_config.r,
        "alpha": peft_config.lora_alpha,
        "dropout": peft_config.lora_dropout,
        **lora_targets(peft_config),
    }


def eval_generations(args: Any, cfg: Config) -> int:
    """Completions per eval prompt, as TRL's ``num_generations_eval or num_generations``: a GRPOConfig's own
    fields; a dict's ``eval.num_samples`` when it sets it; a Config or YAML file's ``eval.num_samples``."""
    if hasattr(args, "num_generations_eval"):  # TRL's GRPOConfig
        return int(args.num_generations_eval or cfg.rollout.num_generations)
    if isinstance(args, Mapping):
        raw = _raw_config(args)
        given = isinstance(raw.get("eval"), Mapping) and "num_samples" in raw["eval"]
        return cfg.eval.num_samples if given else cfg.rollout.num_generations
    return cfg.eval.num_samples if args is not None else cfg.rollout.num_generations


def trl_logging_steps(args: Any) -> int | None:
    """TRL's logging interval in optimizer steps, for a GRPOConfig that logs by steps (a fraction of the run is
    refused by the conversion); None otherwise."""
    if not _is_trl_config(args) or str(getattr(args, "logging_strategy", "steps")).split(".")[-1].lower() != "steps":
        return None
    return max(int(args.logging_steps), 1)


def note_router_loss(config: Any) -> None:
    """A Mixture-of-Experts model trained from TRL's GRPOConfig: TRL 1.16 adds the model's load-balancing loss
    (``router_aux_loss_coef`` of its config) when the GRPOConfig leaves it unset; grpolab adds none. Logged."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    coef = getattr(text, "router_aux_loss_coef", 0.0)
    if hasattr(text, "output_router_logits") and coef:
        log.warning(
            "%s is a Mixture-of-Experts model: TRL would add its load-balancing loss (router_aux_loss_coef %g, from "
            "its config); grpolab adds none, so the router is trained by the GRPO loss alone (trainer.aux_loss_enabled "
            "is False)", type(config).__name__.removesuffix("Config"), coef,
        )


def with_environment(owner: Any, raw: dict[str, Any], tools: Any, environment_factory: Any, rewards: tuple) -> tuple:
    """TRL's ``tools`` / ``environment_factory`` as ``env.name: trl`` (grpolab.envs.trl_env), registered while
    ``owner`` lives; each environment class with ``get_reward`` adds TRL's reward function over ``environments``
    (weight 1, named after the class: trl_env.env_reward). ``rewards`` is (reward_funcs, reward_weights, reward
    tokenizers), returned with those rewards added, then TRL's ``tools`` (the standalone ones and every environment's methods); with no
    reward at all, one line (TRL: "No reward source provided")."""
    reward_funcs, weights, tokenizers = rewards
    rewarded: tuple[type, ...] = ()
    offered = list(tools or [])
    if tools or environment_factory:
        handle, spec = register(tools, environment_factory)
        weakref.finalize(owner, unregister, handle)
        set_key(raw, "env", "name", "trl")
        set_key(raw, "env", "kwargs", {"handle": handle})
        rewarded = spec.rewarded
        for factory in spec.factories.values():  # TRL's trainer.tools: a probe instance's methods, once by name
            for method in env_methods(factory()):
                if method.__name__ not in {fn.__name__ for fn in offered}:
                    offered.append(method)
    if rewarded:
        owned = [env_reward(env_type) for env_type in rewarded]
        reward_funcs = [*(as_list(reward_funcs) if reward_funcs is not None else []), *owned]
        weights = None if weights is None else [*weights, *[1.0] * len(owned)]
        tokenizers = None if tokenizers is None else [*tokenizers, *[None] * len(owned)]
    if not reward_funcs:
        raise ConfigError(
            "No reward source provided: pass reward_funcs, or an environment_factory whose environment defines "
            "get_reward()"
        )
    return reward_funcs, weights, tokenizers, offered
