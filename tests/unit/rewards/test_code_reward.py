"""The code_tests reward: code extraction, the two test formats, scoring, and errors naming the example."""

from __future__ import annotations

import pytest

from grpolab.rewards import RewardError, build_reward, score_batch
from grpolab.rewards.code import CodeTests, extract_code, read_tests
from grpolab.types import Completion, Example

ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 5"]


def fenced(code: str, lang: str = "python") -> str:
    return f"Here it is:\n```{lang}\n{code}\n```\nDone."


@pytest.mark.parametrize(
    ("text", "code"),
    [
        (fenced("x = 1"), "x = 1\n"),
        (fenced("x = 1", "py"), "x = 1\n"),
        (fenced("x = 1", ""), "x = 1\n"),
        ("```python\nx = 1\n```\nthen\n```python\nx = 2\n```", "x = 2\n"),
        ("<think>```python\nx = 1\n```</think>```python\nx = 2\n```", "x = 2\n"),
        ("<answer>x = 3</answer>", "x = 3"),
        ("no code here", None),
        ("", None),
    ],
)
def test_extract_code(text, code):
    assert extract_code(text) == code


@pytest.fixture(scope="module")
def reward() -> CodeTests:
    return build_reward("code_tests", kwargs={"timeout_s": 2.0, "memory_mb": 256}).reward


def test_fraction_of_assert_tests_passed(reward):
    good = Completion(fenced("def add(a, b):\n    return a + b"), 10)
    wrong = Completion(fenced("def add(a, b):\n    return 3"), 10)
    crash = Completion(fenced("raise SystemExit(0)"), 10)
    none = Completion("I don't know", 3)
    empty = Completion("", 1)
    example = Example("add two numbers", meta={"tests": ADD_TESTS})
    scores = reward([good, wrong, crash, none, empty], [example] * 5)
    assert scores == [pytest.approx(2 / 3), pytest.approx(1 / 3), 0.0, 0.0, 0.0]


def test_stdin_stdout_cases_and_the_jsonl_row_location(reward):
    tests = [{"input": "3 4\n", "output": "7\n"}, {"input": "1 1", "output": "2"}, {"input": "0 0", "output": "1"}]
    example = Example("sum of two ints", meta={"row": {"prompt": "p", "tests": tests}})
    program = "a, b = map(int, input().split())\nprint(a + b)   \n"
    scores = reward([Completion(fenced(program), 9), Completion(fenced("print(7)"), 3)], [example] * 2)
    assert scores == [pytest.approx(2 / 3), pytest.approx(1 / 3)]
    all_or_nothing = CodeTests(timeout_s=2.0, memory_mb=256, all_or_nothing=True)
    assert all_or_nothing([Completion(fenced(program), 9)], [example]) == [0.0]


def test_workers_give_the_same_scores(reward):
    parallel = CodeTests(timeout_s=2.0, memory_mb=256, workers=3)
    completions = [Completion(fenced(f"def add(a, b):\n    return a + b + {k}"), 5) for k in range(4)]
    examples = [Example("q", meta={"tests": ADD_TESTS})] * 4
    assert parallel(completions, examples) == reward(completions, examples)


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ({}, "has no 'tests'"),
        ({"tests": []}, "not a non-empty list"),
        ({"tests": [{"input": "1"}]}, "misshapes its items"),
        ({"tests": ["assert True", {"input": "", "output": ""}]}, "mixes or misshapes"),
    ],
)
def test_bad_tests_name_the_example(reward, meta, message):
    examples = [Example("fine", meta={"tests": ["assert True"]}), Example("the broken one", meta=meta)]
    completions = [Completion("", 1)] * 2
    with pytest.raises(RewardError, match=rf"example 1 \(prompt: 'the broken one'\).*{message}"):
        score_batch([build_reward("code_tests")], completions, examples, timeout_s=None)
    assert read_tests(examples[0]) == ["assert True"]


def test_bad_limits_are_refused_at_construction():
    with pytest.raises(ValueError, match="memory_mb >= 32"):
        build_reward("code_tests", kwargs={"memory_mb": 1})
    with pytest.raises(ValueError, match="does not accept kwargs"):
        build_reward("code_tests", kwargs={"timeout": 1})
