import textwrap

import pytest

from grpolab.rewards import REWARDS, WeightedReward, build_reward, score_batch
from grpolab.types import Completion, Example

USER_MODULE = """
    from grpolab.rewards import per_sample

    def contains(completion, example, *, word="yes"):
        return float(word in completion.text)

    @per_sample(name="decorated")
    def decorated(completion, example):
        return 0.25

    class Batched:
        def __init__(self, scale=1.0):
            self.scale = scale

        def __call__(self, completions, examples):
            return [self.scale * c.num_tokens for c in completions]

    class Named(Batched):
        name = "named_batched"

    NOT_A_REWARD = 3
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards"


COMPLETIONS = [Completion("yes sir", 3), Completion("no", 4)]
EXAMPLES = [Example("q1", "1"), Example("q2", "2")]


def values(wr: WeightedReward) -> list:
    return score_batch([wr], COMPLETIONS, EXAMPLES, timeout_s=None).components[wr.name]


def test_registry_keys():
    assert set(REWARDS) == {
        "exact_match",
        "answer_anywhere",
        "math_accuracy",
        "r1_format",
        "soft_overlong",
        "length_penalty",
        "truncation_penalty",
        "reasoning_gym",
        "reward_model",
        "code_tests",
        "env",
        "judge",
        "group_judge",
    }


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"),
    [
        ("exact_match", {"extract": "none"}, [0.0, 0.0]),
        ("r1_format", {"prefilled_think": True}, [0.0, 0.0]),
        ("soft_overlong", {"max_length": 4, "cache_length": 2}, [-0.5, -1.0]),
        ("length_penalty", {"coef": 1.0, "max_length": 4}, [-0.75, -1.0]),
        ("truncation_penalty", {}, [0.0, 0.0]),
        ("math_accuracy", {}, [0.0, 0.0]),
    ],
)
def test_build_builtin(name, kwargs, expected):
    wr = build_reward(name, weight=2.0, kwargs=kwargs)
    assert wr.name == name and wr.weight == 2.0
    assert values(wr) == pytest.approx(expected)


def test_unknown_name_suggests():
    with pytest.raises(
        ValueError,
        match=r"unknown reward 'math_acc'; did you mean 'math_accuracy'\?.*known rewards: .*exact_match",
    ):
        build_reward("math_acc")


def test_bad_kwargs_show_signature():
    with pytest.raises(
        ValueError, match=r"reward 'soft_overlong' does not accept kwargs \{'max_len': 3\}.*signature is"
    ):
        build_reward("soft_overlong", kwargs={"max_len": 3})


def test_user_per_sample_function(user_module):
    wr = build_reward(f"{user_module}:contains", weight=0.5)
    assert wr.name == "contains" and values(wr) == [1.0, 0.0]
    assert values(build_reward(f"{user_module}:contains", kwargs={"word": "no"})) == [0.0, 1.0]
    with pytest.raises(ValueError, match="does not accept kwargs"):
        build_reward(f"{user_module}:contains", kwargs={"wrod": "no"})


def test_user_reward_object_and_classes(user_module):
    assert values(build_reward(f"{user_module}:decorated")) == [0.25, 0.25]
    with pytest.raises(ValueError, match="already a reward object; it takes no kwargs"):
        build_reward(f"{user_module}:decorated", kwargs={"x": 1})
    batched = build_reward(f"{user_module}:Batched", kwargs={"scale": 0.5})
    assert batched.name == "Batched" and values(batched) == [1.5, 2.0]
    assert build_reward(f"{user_module}:Named").name == "named_batched"


@pytest.mark.parametrize(
    ("spec", "pattern"),
    [
        ("no_such_module_xyz:fn", r"cannot import module 'no_such_module_xyz'.*PYTHONPATH"),
        ("my_rewards:contain", r"module 'my_rewards' has no attribute 'contain'; did you mean contains\?"),
        ("my_rewards:NOT_A_REWARD", r"is a int, not a function, class or reward object"),
        ("my_rewards:", r"'package.module:function'"),
    ],
)
def test_user_reward_errors(user_module, spec, pattern):
    with pytest.raises(ValueError, match=pattern):
        build_reward(spec)


def test_an_alias_renames_a_reward_so_two_of_one_kind_can_be_combined():
    a = build_reward("exact_match", kwargs={"extract": "none"})
    b = build_reward("exact_match", kwargs={"extract": "last_line"}, alias="exact_last_line", weight=0.5)
    result = score_batch([a, b], [Completion("x\n2", 2)], [Example("1+1=", answer="2")], timeout_s=None)
    assert result.components == {"exact_match": [0.0], "exact_last_line": [1.0]}
    assert result.total == [0.5]
