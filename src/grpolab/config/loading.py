"""Reading a config: YAML, dotted overrides, type checks against the declared fields, and writing it back."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import re
import sys
import types
import typing
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from grpolab.config.checks import ConfigWarning
from grpolab.config.resolve import config_fields, resolve_settings
from grpolab.config.root import Config
from grpolab.config.trl_names import trl_hint
from grpolab.errors import ConfigError


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Read a YAML file (optional), apply ``key.sub=value`` overrides, validate, return a Config."""
    raw: dict[str, Any] = {}
    if path is not None:
        raw = _read_yaml(Path(path))
    overridden = []
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override '{item}' must look like section.key=value, e.g. algo.beta=0.0")
        _set_dotted(raw, key.strip(), _parse_scalar(text))
        overridden.append(key.strip())
    try:
        cfg = config_from_dict(raw)
    except ConfigError as err:
        line = _line_of(err, Path(path), overridden) if path is not None else None
        if line is None:
            raise
        raise ConfigError(f"{path}:{line}: {err}") from err
    if path is not None:
        _importable(Path(path).resolve().parent)
    return cfg


def _importable(folder: Path) -> None:
    """The config file's folder joins the import path (last, so it shadows no installed package): a reward
    module beside the config (``reward.functions=[{name: 'my_rewards:fn'}]``) imports without PYTHONPATH."""
    if str(folder) not in sys.path:
        sys.path.append(str(folder))


_DOTTED = re.compile(r"[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*|\[\d+\])+")


def _key_lines(node: Any, prefix: str = "") -> dict[str, int]:
    """Dotted key -> line (1-based) of every key of a composed YAML document."""
    out: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = f"{prefix}{key_node.value}"
            out[key] = key_node.start_mark.line + 1
            out.update(_key_lines(value_node, key + "."))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[f"{prefix.rstrip('.')}[{i}]"] = item.start_mark.line + 1
            out.update(_key_lines(item, f"{prefix.rstrip('.')}[{i}]."))
    return out


def _line_of(err: ConfigError, path: Path, overridden: Sequence[str]) -> int | None:
    """The line of the config file that holds the key an error names, unless an override set it."""
    try:
        lines = _key_lines(yaml.compose(path.read_text(encoding="utf-8")))
    except (yaml.YAMLError, OSError, UnicodeDecodeError):
        return None
    for token in _DOTTED.findall(str(err)):
        if any(token == k or token.startswith((k + ".", k + "[")) for k in overridden):
            continue
        key = token
        while key:
            if key in lines:
                return lines[key]
            key = key.rpartition(".")[0] if "." in key else ""
    return None


def config_from_dict(raw: Mapping[str, Any]) -> Config:
    """The Config resolved from the settings ``raw`` (nested plain data, as a YAML file holds them), which it
    keeps as ``Config.settings``: the one way a run config is built (``derive`` goes through it too)."""
    settings = copy.deepcopy(dict(raw))
    resolved, notes = resolve_settings(settings)
    try:
        cfg = _build(Config, resolved, prefix="", extra={"settings": settings})
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:  # a constructor check that is not a ConfigError
        raise ConfigError(str(err)) from err
    for note in notes:  # what resolution changed by itself (a preset's minibatch count fitted to the batch)
        warnings.warn(note, ConfigWarning, stacklevel=3)
    return cfg


def derive(cfg: Config, changes: Mapping[str, Any]) -> Config:
    """``cfg`` with the dotted ``changes`` applied to the settings the user wrote, resolved afresh: what a
    study (compare, claims, hacking, recipe) uses for each run it derives. A preset field the user left unset
    takes the new ``algo.name``'s value; one the user set keeps it. The result equals ``load_config`` of the
    same file with ``changes`` as overrides."""
    settings = user_settings(cfg)
    if settings is None:  # deriving from it would take values the user never set for theirs
        raise ConfigError(
            "derive: the config no longer matches the settings it was built from (was it built directly, or "
            "changed with dataclasses.replace?); build it with load_config / config_from_dict / derive"
        )
    for key, value in changes.items():
        _set_dotted(settings, key, value)
    return config_from_dict(settings)


def user_settings(cfg: Config) -> dict[str, Any] | None:
    """A copy of the settings ``cfg`` was resolved from, or None when they no longer describe it (a Config
    built directly, or changed with ``dataclasses.replace`` after it was built)."""
    with warnings.catch_warnings():  # the rebuild's warnings were given when cfg was built
        warnings.simplefilter("ignore")
        if config_from_dict(cfg.settings) != cfg:
            return None
    return copy.deepcopy(dict(cfg.settings))


def config_to_dict(cfg: Any) -> Any:
    """Plain data (dicts, lists, scalars) for YAML / JSON output; fields that are not config keys left out."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: config_to_dict(getattr(cfg, f.name)) for f in config_fields(cfg)}
    if isinstance(cfg, Mapping):
        return {k: config_to_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, tuple | list):
        return [config_to_dict(v) for v in cfg]
    return cfg


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_MERGE = "tag:yaml.org,2002:merge"

# YAML 1.1 (PyYAML) reads 010 as octal 8 and 1:30 as sexagesimal 90. Integers here are read as a person
# writes them: decimal, leading zeros and all (010 is 10); 0x / 0o / 0b prefixes say another base.
_INT_RE = re.compile(r"^(?:[-+]?[0-9][0-9_]*|[-+]?0x[0-9a-fA-F_]+|[-+]?0o[0-7_]+|[-+]?0b[01_]+)$")
_FLOAT_RE = re.compile(  # PyYAML's, without its sexagesimal form (1:30.5)
    r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node).replace("_", "")
    sign, digits = (-1, text[1:]) if text[0] == "-" else (1, text.lstrip("+"))
    return sign * int(digits, 0 if digits[:2].lower() in ("0x", "0o", "0b") else 10)


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently),
    reads integers in decimal (010 is 10, not YAML 1.1's octal 8; no sexagesimal 1:30) and supports
    merge keys (``<<: *defaults``; a key written beside the merge overrides the merged one)."""

    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT, _FLOAT)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(
                    f"{self.name}:{line}: key '{key}' is given twice (first on line {seen[key]}); YAML would "
                    "keep only the last one: merge the two into one"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_implicit_resolver(_INT, _INT_RE, list("-+0123456789"))
_UniqueKeyLoader.add_implicit_resolver(_FLOAT, _FLOAT_RE, list("-+0123456789."))
_UniqueKeyLoader.add_constructor(_INT, _construct_int)


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if path.is_dir():
        raise ConfigError(f"--config {path} is a folder; give the YAML file itself (e.g. {path}/config.yaml)")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        line = path.read_bytes()[: err.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line} is not UTF-8 text (byte {err.start}); save the file as UTF-8") from err
    except OSError as err:
        raise ConfigError(f"config file {path} cannot be read: {err.strerror}") from err
    try:
        loader = _UniqueKeyLoader(text)
        loader.name = str(path)
        try:
            data = loader.get_single_data() or {}
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model:, algo:, ...)")
    return data


def _parse_scalar(text: str) -> Any:
    loader = _UniqueKeyLoader(text)
    loader.name = f"override value {text!r}"
    try:
        return loader.get_single_data()
    except yaml.YAMLError:
        return text
    finally:
        loader.dispose()


def _set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override '{key}': '{part}' is a value, not a section")
        node = child
    node[parts[-1]] = value


def _build(cls: type, raw: Any, prefix: str, extra: Mapping[str, Any] | None = None) -> Any:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config key '{prefix.rstrip('.') or '<top>'}' must be a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in config_fields(cls)]
    for key in raw:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; known keys: {', '.join(names)}"
            hint = trl_hint(str(key)) or hint
            raise ConfigError(f"unknown config key '{prefix}{key}'{hint}")
    values = {k: _coerce(hints[k], v, f"{prefix}{k}") for k, v in raw.items()}
    return cls(**values, **(extra or {}))


def _coerce(tp: Any, value: Any, key: str) -> Any:  # noqa: C901 - one branch per kind of type
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key + ".")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"config key '{key}': {value!r} is not one of {list(choices)}{hint}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(arg, value, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(
            errors[0] if len(errors) == 1 else f"config key '{key}': {value!r} fits none of {tp}"
        )
    if origin is tuple:
        if not isinstance(value, list | tuple):
            value = [value] if isinstance(value, str | Mapping) else value
        if not isinstance(value, list | tuple):
            raise ConfigError(f"config key '{key}' must be a list, got {value!r}")
        args = typing.get_args(tp)
        item_types = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(item_types) != len(value):
            raise ConfigError(f"config key '{key}' needs {len(item_types)} values, got {len(value)}")
        return tuple(
            _coerce(t, v, f"{key}[{i}]") for i, (t, v) in enumerate(zip(item_types, value, strict=True))
        )
    if origin is Mapping or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"config key '{key}' must be a mapping, got {value!r}")
        return dict(value)
    return _coerce_scalar(tp, value, key)


def _coerce_scalar(tp: Any, value: Any, key: str) -> Any:
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads 1e-6 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        raise ConfigError(f"config key '{key}': unsupported type {tp}")
    raise ConfigError(f"config key '{key}' must be {tp.__name__}, got {value!r} ({type(value).__name__})")
