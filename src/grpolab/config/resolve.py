"""From the settings a user wrote to the values a run uses: the algorithm preset fills the ``algo`` keys left
unset, before any dataclass is built, so a built ``Config`` is never changed afterwards.

The user's settings (the YAML file with its dotted overrides applied, as nested plain data) are the source of
truth: ``Config.settings`` keeps them, and ``derive`` (config/loading.py) builds every other config from them.
Switching ``algo.name`` therefore re-resolves the new preset from what the user wrote, instead of inheriting
the previous preset's values (the fault that made ``compare --algos grpo,dapo`` train GRPO under DAPO's name).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from grpolab.config.presets import ALGO_PRESETS
from grpolab.config.run_sections import TrainConfig

NOT_A_KEY = {"config_key": False}
"""Field metadata: a field that is not a config key (the loader refuses it, config_to_dict leaves it out)."""


def config_fields(cls: Any) -> list[dataclasses.Field]:
    """The fields of a config dataclass (or instance) that are config keys: all but ``Config.settings``."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get("config_key", True)]


def fill_preset(algo: Mapping[str, Any]) -> tuple[dict[str, Any], frozenset[str]]:
    """``algo`` (the user's ``algo`` section) with every preset key it leaves unset or null filled from
    ``ALGO_PRESETS[algo['name']]``, and the keys filled. ``clip_high`` left unset follows ``clip_low`` where the
    preset's clip is symmetric. An unknown name is returned as is: the loader names it with a suggestion."""
    out = dict(algo)
    preset = ALGO_PRESETS.get(out.get("name", "grpo"))
    if preset is None:
        return out, frozenset()
    filled = frozenset(k for k in preset if out.get(k) is None)
    out.update({k: preset[k] for k in filled})
    if out.get("clip_high") is None:
        out["clip_high"] = out["clip_low"]
    return out, filled


def fit_minibatches(algo: dict[str, Any], train: Mapping[str, Any], filled: frozenset[str]) -> list[str]:
    """A preset's minibatch count (DAPO, CISPO: 16) that does not divide train.prompts_per_step into whole
    groups becomes the largest count that does, in ``algo``, with one warning (returned); a count the user set
    is never changed. Values of the wrong type are left for the loader to report."""
    prompts, n = train.get("prompts_per_step", TrainConfig.prompts_per_step), algo.get("num_minibatches")
    if "num_minibatches" not in filled or not all(type(v) is int and v >= 1 for v in (prompts, n)):
        return []
    if prompts % n == 0:
        return []
    fit = max(d for d in range(1, n + 1) if prompts % d == 0)
    algo["num_minibatches"] = fit
    return [
        f"algo.name={algo.get('name', 'grpo')}: the preset's {n} minibatches per step need train.prompts_per_step "
        f"divisible by {n}; with {prompts} prompts per step it runs {fit} (set train.prompts_per_step={n} for the "
        f"paper's {n} updates per rollout)"
    ]


def resolve_settings(settings: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The values a run uses, as plain data, from the user's ``settings`` (left unchanged), and the notes of
    what resolution changed (a fitted minibatch count) for the caller to warn."""
    resolved = copy.deepcopy(dict(settings))
    algo, train = resolved.get("algo", {}), resolved.get("train", {})
    if not isinstance(algo, Mapping) or not isinstance(train, Mapping):
        return resolved, []  # not a section: the loader reports it
    algo, filled = fill_preset(algo)
    notes = fit_minibatches(algo, train, filled)
    resolved["algo"] = algo
    return resolved, notes


def from_preset(settings: Mapping[str, Any], key: str) -> bool:
    """True when the dotted ``algo.<field>`` ``key`` was left unset (or null) in ``settings`` and a preset
    filled it."""
    section, _, field = key.partition(".")
    algo = settings.get("algo", {}) if section == "algo" else None
    if not isinstance(algo, Mapping) or algo.get("name", "grpo") not in ALGO_PRESETS:
        return False
    preset = ALGO_PRESETS[algo.get("name", "grpo")]
    return algo.get(field) is None and (field in preset or field == "clip_high")
