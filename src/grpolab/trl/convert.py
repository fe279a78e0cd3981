"""``grpolab convert-trl``: a TRL GRPOConfig (object, dict, TRL YAML or TRL command-line arguments) to a
grpolab config.

Every GRPOConfig field goes through ``TRL_FIELDS`` (grpolab.trl.fields): mapped to the grpolab keys
that reproduce TRL's behaviour, refused with the reason, or listed as not applicable. The fields of TRL's
``trl grpo`` script (model, dataset, LoRA, reward functions), open-r1's among them, go through
``SCRIPT_FIELDS`` (grpolab.trl.script). A key that is neither is an error, so a field a newer TRL adds is never
dropped in silence. An open-r1 recipe's unset fields are first filled with what open-r1's script and TRL did in
its era (grpolab.trl.open_r1), and a recipe's own ``num_processes`` is the world size unless the caller gives
one. Where TRL counts optimizer steps (max_steps, save_steps, logging_steps, ref_model_sync_steps) grpolab
counts generation batches: they are divided by the optimizer steps per generation batch (notes say where that
rounds). A name of the one TRL name table (grpolab.config.trl_names, which the config loader's unknown-key hint reads too) is
described in that table's words (``named``), never in words of its own.

Needs TRL installed (for GRPOConfig's fields and defaults): pip install 'grpolab[trl]'.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grpolab.config.loading import _set_dotted, config_from_dict
from grpolab.config.root import Config
from grpolab.errors import ConfigError
from grpolab.trl.fields import TRL_FIELDS
from grpolab.trl.input import numeric_fields, read_trl, typed
from grpolab.trl.kinds import Refused, TrlField
from grpolab.trl.legacy import check_size, legacy_names, short
from grpolab.trl.open_r1 import open_r1_recipe, world_size
from grpolab.trl.script import SCRIPT_DEFAULTS, SCRIPT_FIELDS

__all__ = [
    "SCRIPT_FIELDS", "TRL_FIELDS", "TrlConversion", "convert_trl", "markdown_table", "trl_defaults",
    "write_trl_conversion",
]


def trl_defaults() -> dict[str, Any]:
    """GRPOConfig's fields and defaults, read from the installed TRL."""
    try:
        from trl import GRPOConfig
    except ImportError as err:
        raise ConfigError("grpolab convert-trl reads TRL's GRPOConfig: pip install 'grpolab[trl]'") from err
    return {f.name: _default(f) for f in dataclasses.fields(GRPOConfig) if f.init}


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


# ----------------------------------------------------------------------------- the conversion


@dataclass(frozen=True)
class Geometry:
    prompts_per_step: int
    num_minibatches: int
    optimizer_steps_per_generation: int
    num_steps: int | None


def _geometry(v: Mapping[str, Any], num_processes: int, dataset_rows: int | None) -> Geometry:
    """TRL's GRPOConfig.__post_init__ arithmetic: generation_batch_size = per-device batch x processes x
    steps_per_generation (default: gradient_accumulation_steps)."""
    per_device, accumulation = v["per_device_train_batch_size"], v["gradient_accumulation_steps"]
    global_batch = per_device * num_processes
    spg, gbs = v["steps_per_generation"], v["generation_batch_size"]
    if spg is None:
        if gbs is not None and gbs % global_batch:
            raise Refused(f"generation_batch_size {gbs} is not a multiple of the global batch {global_batch}")
        spg = accumulation if gbs is None else gbs // global_batch
    gbs = global_batch * spg
    if gbs % v["num_generations"]:
        raise Refused(f"generation_batch_size {gbs} is not a multiple of num_generations {v['num_generations']}")
    if spg % accumulation:
        raise Refused(
            f"steps_per_generation={spg} is not a multiple of gradient_accumulation_steps={accumulation}: an "
            "optimizer step would span two generation batches, which grpolab's steps never do"
        )
    prompts, minibatches = gbs // v["num_generations"], spg // accumulation
    if prompts % minibatches:
        raise Refused(
            f"{minibatches} optimizer steps per generation batch of {prompts} prompt group(s) split a group of "
            f"num_generations={v['num_generations']} completions over optimizer steps; grpolab's minibatches hold "
            "whole groups"
        )
    per_generation = minibatches * v["num_iterations"]
    steps = None
    if v["max_steps"] > 0:
        steps = math.ceil(v["max_steps"] / per_generation)
    elif dataset_rows:
        steps = max(1, math.ceil(v["num_train_epochs"] * dataset_rows / prompts))
    if steps is not None and steps > 2**31:
        raise ConfigError(
            f"convert-trl: max_steps / num_train_epochs: a run of {short(steps)} generation batches is out of range "
            "(at most 2^31)"
        )
    return Geometry(prompts, minibatches, per_generation, steps)


class TrlView:
    """What a rule reads: every TRL value (``trl["beta"]``), the batch geometry, and where to leave notes."""

    def __init__(self, values: Mapping[str, Any], *, num_processes: int, dataset_rows: int | None) -> None:
        self.values = dict(values)
        self.dataset_rows = dataset_rows
        self.notes: list[str] = []
        self.todos: list[str] = []
        self.rewards: list[dict[str, Any]] = []
        self.geometry = _geometry(self.values, num_processes, dataset_rows)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def note(self, text: str) -> None:
        self.notes.append(text)

    def todo(self, text: str) -> None:
        self.todos.append(text)

    @property
    def ratio_is_one(self) -> bool:
        return self.geometry.optimizer_steps_per_generation == 1

    def reward_weights(self, weights: Sequence[float] | None) -> dict[str, Any]:
        if weights is None:
            return {}
        if not self.rewards:
            self.todo(f"reward.functions: give the entries weights {list(weights)} (reward_weights), in order")
            return {}
        if len(weights) != len(self.rewards):
            raise Refused(f"reward_weights has {len(weights)} values for {len(self.rewards)} reward functions")
        specs = [{**spec, "weight": w} for spec, w in zip(self.rewards, weights, strict=True)]
        return {"reward.functions": specs}


@dataclass
class TrlConversion:
    keys: dict[str, Any]
    """grpolab dotted key -> value."""
    notes: list[str] = field(default_factory=list)
    """Where grpolab's behaviour is close to TRL's but not identical."""
    todo: list[str] = field(default_factory=list)
    """What the TRL config does not say and the grpolab config needs (model, data, rewards, run length)."""
    ignored: list[str] = field(default_factory=list)
    """Not-applicable fields set to a non-default value: 'name=value: why'."""
    legacy: list[str] = field(default_factory=list)
    """Fields given under a name TRL or transformers dropped, and what they were read as."""
    recipe: list[str] = field(default_factory=list)
    """The recipe's own process count, and what open-r1's script and TRL did with the fields it leaves unset."""

    def config_dict(self) -> dict[str, Any]:

        nested: dict[str, Any] = {}
        for key in sorted(self.keys, key=_config_order):
            _set_dotted(nested, key, self.keys[key])
        return nested

    def to_yaml(self, source: str = "a TRL GRPOConfig") -> str:
        lines = [f"# grpolab config converted from {source} by grpolab convert-trl"]
        for title, items in (("to fill in", self.todo), ("from the recipe's script and era", self.recipe),
                             ("mapped from legacy names", self.legacy), ("differences from TRL", self.notes),
                             ("ignored (not applicable)", self.ignored)):
            if items:
                lines.append(f"# {title}:")
                lines.extend(f"#   - {item}" for item in items)
        return "\n".join(lines) + "\n" + yaml.safe_dump(self.config_dict(), sort_keys=False)


def _config_order(key: str) -> tuple[int, ...]:
    """Sort dotted keys as the Config dataclasses declare them (model, data, rollout, algo, ...)."""

    node: Any = Config
    rank = []
    for part in key.split("."):
        if not dataclasses.is_dataclass(node):
            break
        hints = typing.get_type_hints(node)
        names = list(hints)
        rank.append(names.index(part) if part in names else len(names))
        node = hints.get(part)
    return tuple(rank)


def convert_trl(
    source: Any, *, num_processes: int | None = None, dataset_rows: int | None = None, strict: bool = False
) -> TrlConversion:
    """A TRL GRPOConfig (object), a dict of its fields, a TRL YAML path, or TRL CLI args (a list of
    strings such as ``["--learning_rate", "1e-6"]``) -> the grpolab keys; ConfigError names every
    refused field with the reason. ``num_processes``: TRL's world size (its batch sizes are per device);
    None: the recipe's own ``num_processes``, else 1. ``dataset_rows``: for num_train_epochs, the number of
    training rows. ``strict``: refuse also the fields that are only listed (not applicable) or given under a
    legacy name. An open-r1 recipe's unset fields are what open-r1 ran with (grpolab.trl.open_r1)."""
    raw = read_trl(source)
    for name, value in raw.items():
        check_size(str(name), value)
    raw, recipe = open_r1_recipe(raw)
    world, said = world_size(num_processes, raw)
    recipe = [said, *recipe] if said else recipe
    defaults = trl_defaults()
    given, legacy, legacy_ignored = legacy_names(raw, defaults)
    extra = {k: given.pop(k) for k in [k for k in given if k.startswith("data.")]}  # read from legacy names
    unknown = sorted(k for k in given if k not in defaults and k not in SCRIPT_FIELDS)
    if unknown:
        raise ConfigError(
            f"{', '.join(unknown)}: not fields of TRL's GRPOConfig nor of the trl grpo script (this converter "
            "knows TRL 1.16); remove them or update grpolab"
        )
    every_default, numeric = {**defaults, **SCRIPT_DEFAULTS}, numeric_fields()
    values = {**every_default, **{k: typed(k, v, every_default, numeric) for k, v in given.items()}}
    untabled = sorted(set(defaults) - set(TRL_FIELDS))
    if untabled:
        raise ConfigError(f"TRL's GRPOConfig has fields this converter does not know: {', '.join(untabled)}")
    whence = " (the recipe's num_processes)" if num_processes is None and world == raw.get("num_processes") else ""
    view = _view(values, world, dataset_rows, whence)
    out = TrlConversion(dict(extra), legacy=legacy, ignored=list(legacy_ignored), recipe=recipe)
    refused = []
    table = {**SCRIPT_FIELDS, **TRL_FIELDS}  # script first: reward_funcs before reward_weights
    for name, rule in table.items():
        default = defaults.get(name, SCRIPT_DEFAULTS.get(name))
        try:
            out.keys.update(_apply(name, rule, values[name], default, view, out))
        except Refused as err:
            refused.append(f"{name}={short(values[name])}: {err}")
        except ConfigError:
            raise
        except (ArithmeticError, TypeError, ValueError) as err:  # a value out of TRL's range or of the wrong type
            refused.append(f"{name}={short(values[name])}: not a value TRL takes here ({type(err).__name__}: {err})")
    if refused:
        raise ConfigError("convert-trl: grpolab cannot reproduce " + "; ".join(refused))
    out.notes = view.notes
    if strict and (out.ignored or out.legacy):
        listed = [item.split(":")[0] for item in out.ignored + out.legacy]
        raise ConfigError(
            f"convert-trl --strict: {len(listed)} fields are not converted exactly: {', '.join(listed)}; remove "
            "them (or rename the legacy ones), or convert without --strict to have them listed"
        )
    out.todo = [text for key, text in _TRAINER_ARGUMENTS.items() if key not in out.keys] + view.todos
    _validate(out)
    return out


_POSITIVE = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "num_iterations")


def _view(values: dict[str, Any], num_processes: int, dataset_rows: int | None, whence: str = "") -> TrlView:
    """The batch geometry, or one line naming what is wrong with it (and the process counts it would fit)."""
    optional = [k for k in ("steps_per_generation", "generation_batch_size") if values[k] is not None]
    bad = [f"{k}={short(values[k])}" for k in (*_POSITIVE, *optional) if isinstance(values[k], bool)
           or not isinstance(values[k], int) or not 1 <= values[k] <= 2**31]
    if bad or not isinstance(num_processes, int) or not 1 <= num_processes <= 2**16:
        what = ", ".join(bad) or f"--num-processes {num_processes}"
        raise ConfigError(f"convert-trl: {what}: must be a whole number from 1 to 2^31 (processes: to 2^16)")
    try:
        return TrlView(values, num_processes=num_processes, dataset_rows=dataset_rows)
    except Refused as err:
        fits = [n for n in range(1, 65) if _fits(values, n)]
        hint = (f"; it fits {', '.join(map(str, fits[:4]))} processes: pass --num-processes N as accelerate launch "
                "runs it" if fits else "")
        raise ConfigError(
            f"convert-trl: per_device_train_batch_size / steps_per_generation with {num_processes} process"
            f"{'es' if num_processes > 1 else ''}{whence}: {err}{hint}"
        ) from err
    except ConfigError:
        raise
    except (ArithmeticError, TypeError, ValueError) as err:
        raise ConfigError(f"convert-trl: the batch geometry or run length is out of range ({type(err).__name__}: {err})") from err


def _fits(values: dict[str, Any], n: int) -> bool:
    try:
        _geometry(values, n, None)
    except (Refused, ConfigError, ArithmeticError, TypeError, ValueError):
        return False
    return True


_TRAINER_ARGUMENTS = {
    "model.name_or_path": "model.name_or_path: the model TRL's GRPOTrainer was given",
    "data.path": "data.source / data.path: the train_dataset (hf id, folder, or a .jsonl/.parquet/.csv file)",
    "reward.functions": "reward.functions: the reward_funcs ('module:function', kind trl, runs TRL's functions)",
}
"""What GRPOTrainer takes as arguments rather than in its GRPOConfig: the converted config names them as to fill."""


def write_trl_conversion(
    source: Any, out: str | Path, *, num_processes: int | None = None, dataset_rows: int | None = None,
    strict: bool = False,
) -> TrlConversion:
    """``grpolab convert-trl``: convert, then print the YAML (``out="-"``) or write it to ``out``."""
    conversion = convert_trl(source, num_processes=num_processes, dataset_rows=dataset_rows, strict=strict)
    text = conversion.to_yaml(_describe(source))
    if str(out) == "-":
        print(text, end="")
        return conversion
    Path(out).write_text(text, encoding="utf-8")
    todo = f"; fill in: {', '.join(t.split(':')[0] for t in conversion.todo)}" if conversion.todo else ""
    print(f"grpolab: wrote {out} ({len(conversion.keys)} keys){todo}", file=sys.stderr)
    return conversion


def _describe(source: Any) -> str:
    if isinstance(source, str | Path):
        return str(source)
    if isinstance(source, list | tuple):
        return "trl " + " ".join(map(str, source)) if source else "TRL's defaults"
    return f"a TRL {type(source).__name__}"


def _apply(name: str, rule: TrlField, value: Any, default: Any, view: TrlView, out: TrlConversion) -> dict:
    if rule.status == "mapped":
        return rule.convert(value, view)
    if _same(value, default):
        return {}
    if rule.status == "refused":
        raise Refused(rule.why)
    out.ignored.append(f"{name}={short(value)}: {rule.why}")
    return {}


def _same(value: Any, default: Any) -> bool:
    """Is a field left at its default? Also after GRPOConfig.__post_init__, which turns None / "" into
    False / [] / a default AcceleratorConfig and "auto" padding into None (off Neuron)."""
    value, default = getattr(value, "value", value), getattr(default, "value", default)
    if value == default or (not value and not default) or (default == "auto" and value is None):
        return True
    if dataclasses.is_dataclass(value) and not default:
        try:
            return value == type(value)()
        except TypeError:
            return False
    return False


def _validate(out: TrlConversion) -> None:

    try:
        config_from_dict(out.config_dict())
    except ConfigError as err:
        raise ConfigError(f"convert-trl: the converted config is not valid for grpolab: {err}") from err


def markdown_table() -> str:
    """docs/coming_from_trl.md's table: every GRPOConfig field, its status, and grpolab's key or the reason."""
    lines = ["| TRL GRPOConfig field | status | grpolab / reason |", "|---|---|---|"]
    for name, rule in {**TRL_FIELDS, **SCRIPT_FIELDS}.items():
        lines.append(f"| `{name}` | {rule.status.replace('_', ' ')} | {rule.why} |")
    return "\n".join(lines) + "\n"
