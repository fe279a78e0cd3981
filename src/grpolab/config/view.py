"""What ``grpolab config`` prints: the sections a verb reads, with every null that has a known value filled in.

The run's config.yaml keeps the full config (dump_config); this view is for reading. It still loads back
to the same run: the values filled in are the ones the nulls stand for.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from grpolab.config.loading import config_to_dict
from grpolab.config.root import Config

_RUN = ("model", "data", "rollout", "algo", "reward", "optim", "train", "eval", "log", "seed")
SECTIONS: dict[str, tuple[str, ...]] = {
    "train": _RUN,
    "compare": _RUN,
    "train-iterative": (*_RUN, "reward_model", "iterative"),
    "sft": ("model", "data", "train", "sft", "log", "seed"),
    "eval": ("model", "data", "rollout", "reward", "eval", "log", "seed"),
    "train-rm": ("reward_model", "log", "seed"),
    "serve": ("model", "data", "rollout", "vllm", "seed"),
    "claims": (*_RUN, "vllm", "sft", "reward_model", "claims"),
}
"""Verb -> the top-level config keys it reads."""

_CRITIC = (
    "gamma", "lam", "vf_coef", "value_clip", "value_lr", "critic_warmup_steps", "whiten_advantages", "value_init",
    "value_init_path",
)  # fmt: skip
"""algo fields only PPO (a learned value model) reads."""


def config_view(cfg: Config, verb: str = "train") -> dict[str, Any]:
    """The config as plain data, limited to ``verb``'s sections, derivable nulls resolved."""
    full = config_to_dict(cfg)
    view = {key: full[key] for key in SECTIONS[verb]}
    if "model" in view:
        view["model"]["tokenizer"] = cfg.model.tokenizer or cfg.model.name_or_path
    if "log" in view:
        view["log"]["report_to"] = list(cfg.log.trackers)
    if "algo" in view:
        if cfg.algo.needs_critic:
            view["algo"]["value_lr"] = cfg.algo.value_lr or cfg.optim.lr
        else:
            view["algo"] = {k: v for k, v in view["algo"].items() if k not in _CRITIC}
    if "eval" in view:
        view["eval"]["output_dir"] = str(cfg.eval_dir)
    if "sft" in view:
        view["sft"]["output_dir"] = str(cfg.sft_dir)
    if "reward_model" in view:
        rm = view["reward_model"]
        rm["tokenizer"] = cfg.reward_model.tokenizer or cfg.reward_model.base_model
        rm["output_dir"] = str(cfg.reward_model_dir)
    return view


_ALGO_KEY = re.compile(r"^  (\w+):")


def render_view(cfg: Config, verb: str = "train") -> str:
    """``config_view`` as YAML, each algo field the preset filled (the user left it unset) marked
    ``# algo.name=<name> preset``."""
    lines, in_algo = [], False
    for line in yaml.safe_dump(config_view(cfg, verb), sort_keys=False).splitlines():
        if not line.startswith(" "):
            in_algo = line == "algo:"
        key = _ALGO_KEY.match(line) if in_algo else None
        if key and cfg.from_preset(f"algo.{key.group(1)}"):
            line += f"  # algo.name={cfg.algo.name} preset"
        lines.append(line)
    return "\n".join(lines) + "\n"
