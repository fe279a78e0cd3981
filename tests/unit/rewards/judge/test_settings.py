"""A judge's kwargs are checked before anything is started or asked: each bad key is one line naming it."""

from __future__ import annotations

import pytest

from grpolab.config import RewardSpec
from grpolab.errors import ConfigError
from grpolab.rewards import build_rewards
from grpolab.rewards.judge.settings import ServeSettings, settings_from

BASE = {"base_url": "http://127.0.0.1:9/v1", "model": "m", "template": "Grade: {completion}"}


@pytest.mark.parametrize(
    "change, group, message",
    [
        ({"template": None}, False, "template is missing"),
        ({"template": "Grade this"}, False, r"put \{completion\} in it"),
        ({"template": "{completions}"}, False, "is group_judge's"),
        ({"template": "Grade {completion"}, False, "template cannot be read"),
        ({"template": "Grade {completion!r}"}, False, "plain name"),
        ({"base_url": None}, False, "one of base_url"),
        ({"serve": {"model": "x"}}, False, "one of base_url"),
        ({"model": None}, False, "model is missing"),
        ({"base_url": "127.0.0.1:8000"}, False, "not an http"),
        ({"scroe": "number"}, False, "unknown judge key 'scroe'; did you mean score"),
        ({"score": "stars"}, False, "not one of number, verdict, yes_probability"),
        ({"score_range": [10, 0]}, False, "finite low < high"),
        ({"score_range": [0, 5, 10]}, False, "two numbers"),
        ({"concurrency": 0}, False, "concurrency must be >= 1"),
        ({"concurrency": "8"}, False, "concurrency = '8' is a str"),
        ({"timeout_s": True}, False, "timeout_s = True is a bool"),
        ({"score_regex": "Score: \\d+"}, False, "needs a group"),
        ({"score": "verdict", "verdicts": {}}, False, "verdicts is empty"),
        ({"verdicts": {"good": "high"}}, False, "map words to numbers"),
        ({"api_key_env": "MY-KEY"}, False, "not an environment variable"),
        ({"yes_tokens": [True]}, False, "YAML reads yes, no, on, off unquoted as true / false; quote them"),
        ({"verdicts": {True: 1, False: 0}}, False, "quote them"),
        ({"template": "{completions}", "score": "verdict"}, True, "numbers only"),
        ({}, True, r"put \{completions\} in it"),
    ],
)
def test_bad_settings_name_the_key(change, group, message):
    kwargs = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        settings_from(kwargs, group=group)


def test_serve_settings_and_defaults():
    s = settings_from({"serve": {"model": "/m", "max_model_len": 512}, "template": "{completion}"}, group=False)
    assert s.serve == ServeSettings(model="/m", max_model_len=512)
    assert s.model_name == "judge" and s.score == "number" and s.score_range == (0.0, 10.0)
    with pytest.raises(ValueError, match=r"unknown judge key serve.'modle'"):
        settings_from({"serve": {"modle": "/m"}, "template": "{completion}"}, group=False)


def test_a_bad_judge_in_the_config_is_one_config_error_naming_the_entry():
    spec = RewardSpec(name="judge", kwargs={**BASE, "score": "stars"})
    with pytest.raises(ConfigError, match=r"reward.functions\[0\] \(name 'judge'\): .*score 'stars'"):
        build_rewards([spec])
