import math
import re
import subprocess
import sys
import time

import pytest

from grpolab.rewards import (
    RewardError,
    SampleError,
    WeightedReward,
    dry_run,
    per_sample,
    score_batch,
)
from grpolab.types import Completion, Example


def batch(n: int) -> tuple[list[Completion], list[Example]]:
    completions = [Completion(f"c{i}", i + 1) for i in range(n)]
    examples = [Example(f"question number {i}", str(i)) for i in range(n)]
    return completions, examples


def constant(name: str, values):
    class Constant:
        def __call__(self, completions, examples):
            return values

    reward = Constant()
    reward.name = name
    return reward


def test_weighted_sum_and_none_handling():
    a = constant("a", [1.0, None, None, 2])
    b = constant("b", [0.5, 1.0, None, True])
    result = score_batch([WeightedReward(a, 2.0), WeightedReward(b, -1.0)], *batch(4), timeout_s=None)
    # sample 1: only b applies; sample 2: nothing applies; bool True counts as 1.
    assert result.total == [1.5, -1.0, None, 3.0]
    assert result.components == {"a": [1.0, None, None, 2.0], "b": [0.5, 1.0, None, 1.0]}
    assert all(isinstance(v, float) for v in result.components["b"] if v is not None)
    assert set(result.seconds) == {"a", "b"}


def test_per_sample_lifts_and_names():
    @per_sample
    def first_char(completion, example):
        return float(completion.text == "c0")

    named = per_sample(lambda c, e: 1.0, name="ones")
    result = score_batch([WeightedReward(first_char), WeightedReward(named, 0.5)], *batch(2), timeout_s=1.0)
    assert result.components == {"first_char": [1.0, 0.0], "ones": [1.0, 1.0]}
    assert result.total == [1.5, 0.5]


def test_per_sample_decorator_with_name():
    @per_sample(name="custom")
    def fn(completion, example):
        return 0.0

    assert fn.name == "custom"


def test_empty_batch():
    result = score_batch([WeightedReward(constant("a", [1.0]))], [], [], timeout_s=0.1)
    assert result.total == [] and result.components == {"a": []}


@pytest.mark.parametrize(
    ("values", "pattern"),
    [
        (
            [1.0, float("nan"), 0.0],
            r"reward 'bad' returned nan for example 1 \(prompt: 'question number 1'\).*finite",
        ),
        ([1.0, 0.0, math.inf], r"returned inf for example 2 .*finite float"),
        ([1.0, "1.0", 0.0], r"returned '1.0' \(str\) for example 1 .*return a float, or None"),
        ([1.0, [1.0], 0.0], r"returned \[1.0\] \(list\) for example 1"),
        ([1.0, 0.0], r"reward 'bad' returned 2 values for 3 completions.*exactly one value"),
        ([1.0, 0.0, 1.0, 1.0], r"returned 4 values for 3 completions"),
        ("abc", r"reward 'bad' returned str; .*a list"),
        (1.0, r"reward 'bad' returned float"),
    ],
)
def test_bad_values_are_named(values, pattern):
    with pytest.raises(RewardError, match=pattern):
        score_batch([WeightedReward(constant("bad", values))], *batch(3), timeout_s=None)


def test_raising_per_sample_reward_names_example_and_chains():
    def boom(completion, example):
        if completion.text == "c2":
            raise KeyError("needs field 'x'")
        return 0.0

    with pytest.raises(
        SampleError, match=r"reward 'boom' raised KeyError on example 2 \(prompt: 'question number 2'\)"
    ) as info:
        score_batch([WeightedReward(per_sample(boom))], *batch(3), timeout_s=None)
    assert isinstance(info.value.__cause__, KeyError)


def test_raising_batched_reward_names_reward_and_batch():
    class Batched:
        name = "batched"

        def __call__(self, completions, examples):
            raise ZeroDivisionError("oops")

    with pytest.raises(
        RewardError, match=r"reward 'batched' raised ZeroDivisionError on a batch of 3 .*dry_run"
    ) as info:
        score_batch([WeightedReward(Batched())], *batch(3), timeout_s=1.0)  # raised in the worker thread
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_timeout():
    def sleepy(completion, example):
        time.sleep(1.0)
        return 0.0

    start = time.perf_counter()
    message = (
        r"reward 'sleepy' took longer than 0.2 s on a batch of 2 .*raise reward.timeout_s or make it faster"
    )
    with pytest.raises(RewardError, match=message):
        score_batch([WeightedReward(per_sample(sleepy))], *batch(2), timeout_s=0.2)
    assert time.perf_counter() - start < 0.9


def test_mismatched_inputs_and_duplicate_names():
    completions, examples = batch(3)
    with pytest.raises(ValueError, match="3 completions but 2 examples"):
        score_batch([], completions, examples[:2], timeout_s=None)
    a = WeightedReward(constant("a", [0.0] * 3))
    with pytest.raises(ValueError, match="two rewards are named 'a'"):
        score_batch([a, a], completions, examples, timeout_s=None)


def test_weighted_reward_validation():
    with pytest.raises(ValueError, match="finite number"):
        WeightedReward(constant("a", []), float("nan"))
    with pytest.raises(ValueError, match="wrap a per-sample function with per_sample"):
        WeightedReward(lambda c, e: 0.0)


def test_long_prompt_is_cut_in_messages():
    completions = [Completion("x", 1)]
    examples = [Example("HEAD " + "filler " * 100 + "the actual question?", "1")]
    with pytest.raises(RewardError) as info:
        score_batch([WeightedReward(constant("bad", [float("nan")]))], completions, examples, timeout_s=None)
    prompt = re.search(r"prompt: '(.*)'\)", str(info.value)).group(1)
    assert prompt.startswith("HEAD") and prompt.endswith("the actual question?") and len(prompt) <= 80


def test_dry_run_names_the_failing_example_and_times():
    def fails_on_third(completion, example):
        if example.answer == "2":
            raise ValueError("cannot grade")
        return 1.0

    rewards = [
        WeightedReward(per_sample(lambda c, e: 0.0, name="ok")),
        WeightedReward(per_sample(fails_on_third)),
    ]
    with pytest.raises(
        SampleError, match=r"'fails_on_third' raised ValueError on example 2 \(prompt: 'question number 2'\)"
    ):
        dry_run(rewards, *batch(4), timeout_s=1.0)
    seconds = dry_run(rewards[:1], *batch(4), timeout_s=None, max_examples=2)
    assert set(seconds) == {"ok"} and seconds["ok"] >= 0.0


def test_dry_run_names_example_for_bad_value():
    values = iter([[0.0], [0.0], [float("nan")]])
    reward = constant("nan_late", None)
    type(reward).__call__ = lambda self, c, e: next(values)
    with pytest.raises(RewardError, match=r"returned nan for example 2 \(prompt: 'question number 2'\)"):
        dry_run([WeightedReward(reward)], *batch(4), timeout_s=None)


def test_rule_rewards_do_not_import_heavy_packages():
    code = (
        "import sys, grpolab.rewards, grpolab.rewards.rules, grpolab.tasks.reasoning_gym, grpolab.config.templates\n"
        "heavy = [m for m in ('transformers', 'math_verify', 'reasoning_gym') if m in sys.modules]\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_dry_run_timeout_names_the_slow_example():
    def slow_on_second(completion, example):
        if example.answer == "1":
            time.sleep(0.6)
        return 0.0

    with pytest.raises(
        RewardError,
        match=r"took longer than 0.2 s on a batch of 1 .*example 1 \(prompt: 'question number 1'\)",
    ):
        dry_run([WeightedReward(per_sample(slow_on_second))], *batch(3), timeout_s=0.2)
