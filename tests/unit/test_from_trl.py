"""The "Coming from TRL" table (docs/trl.md): every TRL field exists in the installed GRPOConfig with the default
the table gives, every grpolab key exists in our config, and docs/trl.md shows the table as generated."""

import dataclasses
import typing
from pathlib import Path

import pytest

from grpolab.config import Config
from grpolab.config.from_trl import TRL_KEYS, markdown_table

README = Path(__file__).parents[2] / "docs" / "trl.md"


def _grpolab_key_exists(key: str) -> bool:
    node: typing.Any = Config
    for part in key.split("."):
        while typing.get_origin(node) in (tuple, typing.Union, __import__("types").UnionType):
            node = next(a for a in typing.get_args(node) if a is not type(None) and a is not Ellipsis)
        if not dataclasses.is_dataclass(node):
            return False
        hints = typing.get_type_hints(node)
        if part not in hints:
            return False
        node = hints[part]
    return True


def test_every_trl_field_and_default_exists_in_the_installed_trl():
    grpo_config = pytest.importorskip("trl").GRPOConfig
    fields = {f.name: f for f in dataclasses.fields(grpo_config)}
    for k in TRL_KEYS:
        assert k.trl in fields, f"trl.GRPOConfig has no field {k.trl!r} any more: update grpolab.config.from_trl"
        f = fields[k.trl]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert default == k.trl_default, f"TRL's {k.trl} now defaults to {default!r}: update from_trl.TRL_KEYS"


def test_every_grpolab_key_exists_in_the_config():
    for k in TRL_KEYS:
        for key in k.grpolab:
            assert _grpolab_key_exists(key), f"{key} (for TRL's {k.trl}) is not a grpolab config key"
    assert not _grpolab_key_exists("algo.no_such_key") and not _grpolab_key_exists("reward.functions.nope")


def test_the_readme_shows_the_table():
    assert markdown_table() in README.read_text(), (
        "docs/trl.md's table differs from grpolab.config.from_trl.markdown_table(): paste it again"
    )
