"""env.kwargs of a built-in environment are checked with the config (config/env_checks.py): a key out of range
or unknown is one line naming it, before any model loads; the table agrees with the factories themselves."""

from __future__ import annotations

import inspect

import pytest

from grpolab.config import ConfigError, load_config
from grpolab.config.env_checks import ENV_KWARGS
from grpolab.envs import ENVIRONMENTS, ToolLimits, build_environment


def test_the_table_names_exactly_each_built_in_factory_s_arguments():
    assert set(ENV_KWARGS) | {"openenv"} == set(ENVIRONMENTS)  # openenv passes any kwargs on to its server
    for name, known in ENV_KWARGS.items():
        params = set(inspect.signature(ENVIRONMENTS[name]).parameters) - {"limits"}
        assert params == set(known), name


BAD = [
    ("gym_retry", "retries", -1, "give an integer >= 0"),
    ("gym_retry", "retries", 1.5, "give an integer >= 0"),
    ("gym_retry", "retry_discount", 1.5, "give a number in [0, 1]"),
    ("python", "memory_mb", 16, "give an integer >= 32"),
    ("calculator", "call_format", "xml", "give hermes or python"),
    ("calculator", "tools_enabled", "yes", "give true or false"),
]


@pytest.mark.parametrize(("env", "key", "value", "message"), BAD)
def test_a_key_out_of_range_is_one_line_at_load(env, key, value, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"env.name={env}", f"env.kwargs={{{key}: {value!r}}}"])
    assert str(err.value).startswith(f"env.kwargs.{key}={value!r} for env.name={env}: {message}")


@pytest.mark.parametrize(("env", "key", "value"), [("gym_retry", "retries", -1), ("gym_retry", "retry_discount", 1.5),
                                                   ("python", "memory_mb", 16)])  # fmt: skip
def test_what_the_table_refuses_the_factory_refuses_too_as_one_line(env, key, value):
    """(The factories take a fractional retries, any call_format and a truthy tools_enabled, and then misbehave
    quietly: there the table is the stricter.)"""
    with pytest.raises(ConfigError, match=f"env.kwargs=.* do not fit env.name='{env}'"):
        build_environment(env, {key: value}, ToolLimits())


@pytest.mark.parametrize(("env", "kwargs"), [("gym_retry", {"retries": 0, "retry_discount": 1}),
                                             ("python", {"memory_mb": 32}), ("calculator", {"call_format": "python"})])  # fmt: skip
def test_the_edges_of_each_range_are_taken_by_both(env, kwargs):
    load_config(None, [f"env.name={env}", f"env.kwargs={kwargs!r}"])
    build_environment(env, kwargs, ToolLimits())


def test_unknown_keys_and_openenv_without_its_url_are_refused_at_load():
    with pytest.raises(ConfigError, match=r"env.kwargs.retry: env.name=gym_retry takes no 'retry'; its kwargs are retries, retry_discount"):
        load_config(None, ["env.name=gym_retry", "env.kwargs={retry: 2}"])
    with pytest.raises(ConfigError, match="env.name=openenv needs env.kwargs.base_url"):
        load_config(None, ["env.name=openenv"])
