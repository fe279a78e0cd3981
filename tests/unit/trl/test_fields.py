"""The one TRL name table: each TRL name that maps to grpolab keys has its words in one entry of
grpolab.config.trl_names.TRL_NAMES, read both by the config loader's unknown-key hint and by convert-trl's
field table (trl/fields.py, SCRIPT_FIELDS), never written again in the trl package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from grpolab.config import ConfigError, load_config
from grpolab.config.trl_names import TRL_NAMES, trl_hint
from grpolab.trl.convert import SCRIPT_FIELDS, TRL_FIELDS, markdown_table
from grpolab.trl.kinds import mapped, named, read_by, refused, to_key, worded

TRL_PACKAGE = Path(__file__).parents[3] / "src" / "grpolab" / "trl"
TABLES = {**TRL_FIELDS, **SCRIPT_FIELDS}
SHARED = [name for name in TRL_NAMES if name in TABLES]


def test_most_of_the_loaders_names_are_convert_trls_fields():
    assert len(SHARED) >= 40
    assert set(TRL_NAMES) - set(TABLES) == {"warmup_ratio"}  # a legacy name, read as warmup_steps < 1


@pytest.mark.parametrize("name", SHARED)
def test_the_loaders_hint_and_convert_trls_description_are_one_entry(name):
    rule, words = TABLES[name], TRL_NAMES[name]
    assert rule.status == "mapped"
    assert words in trl_hint(name)
    if rule.read_with:  # read by another field's rule: it says so, and names no grpolab key of its own
        assert rule.why == f"read with {rule.read_with}"
        assert rule.read_with in TABLES
    else:
        assert rule.why == words
        assert f"| `{name}` | mapped | {words} |" in markdown_table()


def _rule_calls(tree: ast.AST):
    """(TRL name, the call that builds its rule) for each ``"name": call(...)`` of a dict literal."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(value, ast.Call):
                    yield key.value, value


@pytest.mark.parametrize("module", sorted(TRL_PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_no_trl_package_module_writes_words_for_a_name_of_the_table(module):
    """The words of a TRL_NAMES name live in config/trl_names.py only: the trl package builds its rule with
    named(convert) (the table's words) or read_by(other), never with words of its own."""
    twice = [
        f"{name} (line {call.lineno})"
        for name, call in _rule_calls(ast.parse(module.read_text()))
        if name in TRL_NAMES and not (isinstance(call.func, ast.Name) and call.func.id in ("named", "read_by"))
    ]
    assert twice == [], f"{module.name}: words written again for {twice}; make each rule named(convert)"


def test_worded_refuses_words_written_twice_and_named_fields_the_table_lacks():
    with pytest.raises(ValueError, match="trl_names"):
        worded({"learning_rate": mapped("optim.lr", to_key("optim.lr"))})
    with pytest.raises(ValueError, match="trl_names"):
        worded({"learning_rate": refused("grpolab has no learning rate")})
    with pytest.raises(ValueError, match="no words"):
        worded({"not_a_trl_name": named(to_key("optim.lr"))})
    out = worded({
        "learning_rate": named(to_key("optim.lr")),
        "num_generations": read_by("per_device_train_batch_size"),
        "beta": mapped("algo.beta", to_key("algo.beta")),  # a name only convert-trl describes keeps its words
    })
    assert [rule.why for rule in out.values()] == [
        TRL_NAMES["learning_rate"], "read with per_device_train_batch_size", "algo.beta",
    ]
    assert out["learning_rate"].convert(1e-6, None) == {"optim.lr": 1e-6}


@pytest.mark.parametrize(("override", "name"), [("optim.learning_rate=1e-6", "learning_rate"), ("algo.epsilon=0.2", "epsilon")])
def test_the_loader_error_names_convert_trls_words(override, name):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert TRL_FIELDS[name].why in str(err.value)
