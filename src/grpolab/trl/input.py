"""Reading a TRL config for ``convert_trl``: a GRPOConfig object, a dict, a TRL YAML file, or TRL command-line
arguments (``--learning_rate 1e-6 --num_generations 8``, ``--config trl.yaml``, ``--no_shuffle_dataset``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from grpolab.errors import ConfigError


def read_trl(source: Any) -> dict[str, Any]:
    """The fields the source sets: every field of an object, the keys of a dict or YAML, the CLI's flags."""
    if dataclasses.is_dataclass(source) and not isinstance(source, type):
        return {f.name: getattr(source, f.name) for f in dataclasses.fields(source) if f.init}
    if isinstance(source, Mapping):
        return dict(source)
    if isinstance(source, str | Path):
        return _read_yaml(Path(source))
    if isinstance(source, Sequence):
        return _read_args(list(source))
    raise ConfigError(f"convert-trl takes a GRPOConfig, a dict, a YAML path or CLI args, not {type(source).__name__}")


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"TRL config {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(f"TRL config {path} is not a YAML file: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"TRL config {path}: the top level must map field names to values")
    return data


def _read_args(args: list[str]) -> dict[str, Any]:
    """HfArgumentParser's syntax: ``--name value``, ``--name=value``, ``--name v1 v2`` (a list), a bare
    ``--flag`` (true), ``--no_flag`` (false), and TrlParser's ``--config file.yaml`` (flags win over it)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.endswith((".yaml", ".yml")) and not arg.startswith("--"):  # grpolab convert-trl trl.yaml
            out = {**_read_yaml(Path(arg)), **out}
            i += 1
            continue
        if not arg.startswith("--"):
            raise ConfigError(f"TRL argument {arg!r}: expected a TRL YAML file or --field value")
        name, eq, text = arg[2:].partition("=")
        values = [text] if eq else []
        i += 1
        while not eq and i < len(args) and not args[i].startswith("--"):
            values.append(args[i])
            i += 1
        if name == "config":
            out = {**_read_yaml(Path(values[0])), **out} if values else out
            continue
        if not values:
            value: Any = not name.startswith("no_")
            name = name.removeprefix("no_") if name.startswith("no_") else name
        else:
            parsed = [_scalar(v) for v in values]
            value = parsed[0] if len(parsed) == 1 else parsed
        out[name.replace("-", "_")] = value
    return out


def _scalar(text: str) -> Any:
    if text in ("None", "none", "null"):
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def typed(name: str, value: Any, defaults: Mapping[str, Any]) -> Any:
    """A YAML / CLI string where TRL's field holds a number (YAML reads 1e-6 as text) -> the number."""
    default = defaults.get(name)
    if isinstance(value, str) and isinstance(default, int | float) and not isinstance(default, bool):
        try:
            return type(default)(float(value)) if isinstance(default, int) else float(value)
        except ValueError as err:
            raise ConfigError(f"TRL field {name}={value!r} must be a number") from err
    if isinstance(value, int) and isinstance(default, float) and not isinstance(value, bool):
        return float(value)
    return value
