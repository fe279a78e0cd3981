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


SOLUTIONS = {  # (code, tests): correct solutions using the stdlib modules models typically import
    "typing + dataclasses": (
        "from dataclasses import dataclass, field\nfrom typing import Optional\n\n@dataclass(order=True)\n"
        "class Item:\n    priority: int\n    name: str = field(compare=False)\n\n"
        "def top(items: list[tuple[int, str]]) -> Optional[str]:\n"
        "    return max(Item(p, n) for p, n in items).name if items else None",
        ["assert top([(1, 'a'), (3, 'b'), (2, 'c')]) == 'b'", "assert top([]) is None"],
    ),
    "collections.abc + itertools": (
        "from collections.abc import Iterable\nfrom itertools import chain\n\ndef flatten(xs):\n"
        "    return list(chain.from_iterable(flatten(x) if isinstance(x, Iterable) and not isinstance(x, str)"
        " else [x] for x in xs))",
        ["assert flatten([1, [2, (3, [4])], 'ab']) == [1, 2, 3, 4, 'ab']", "assert flatten([]) == []"],
    ),
    "heapq": (
        "import heapq\n\ndef k_smallest(xs, k):\n    return heapq.nsmallest(k, xs)",
        ["assert k_smallest([5, 1, 4, 2], 2) == [1, 2]", "assert k_smallest([3], 5) == [3]"],
    ),
    "functools": (
        "from functools import lru_cache\n\n@lru_cache(maxsize=None)\ndef fib(n):\n"
        "    return n if n < 2 else fib(n - 1) + fib(n - 2)",
        ["assert fib(80) == 23416728348467685", "assert fib(0) == 0"],
    ),
    "re": (
        "import re\n\ndef words(s):\n    return re.findall(r'\\w+', s)",
        ["assert words('Hello, world! 42') == ['Hello', 'world', '42']"],
    ),
    "math + fractions": (
        "import math\nfrom fractions import Fraction\n\ndef mean(xs):\n    f = Fraction(sum(xs), len(xs))\n"
        "    return f.numerator, f.denominator\n\ndef hyp(a, b):\n    return math.hypot(a, b)",
        ["assert mean([1, 2, 4]) == (7, 3)", "assert math.isclose(hyp(1, 1), 1.41421356, rel_tol=1e-6)"],
    ),
    "collections: Counter, namedtuple, frozenset": (
        "from collections import Counter, namedtuple\nP = namedtuple('P', 'x y')\n\ndef counts(s):\n"
        "    return Counter(s)\n\ndef origin():\n    return P(0, 0)\n\ndef uniq(xs):\n    return frozenset(xs)\n\n"
        "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))",
        [
            "assert counts('abca') == {'a': 2, 'b': 1, 'c': 1}",
            "assert origin() == (0, 0)",
            "assert uniq([1, 1, 2]) == {1, 2}",
            "assert is_prime(7)\nassert not is_prime(9)",
            "assert 7 in [p for p in range(10) if is_prime(p)]",
        ],
    ),
}

PROGRAMS = {  # (program, stdin/stdout cases)
    "heapq + sys.stdin": (
        "import heapq, sys\nnums = list(map(int, sys.stdin.read().split()))\nprint(*heapq.nsmallest(2, nums))",
        [{"input": "5 3 9 1\n", "output": "1 3\n"}, {"input": "2 2", "output": "2 2"}],
    ),
    "dataclasses + typing": (
        "from dataclasses import dataclass\nfrom typing import List\n\n@dataclass\nclass Row:\n    name: str\n"
        "    score: int\n\nrows: List[Row] = [Row(n, int(s)) for n, s in (line.split() for line in open(0))]\n"
        "print(max(rows, key=lambda r: r.score).name)",
        [{"input": "ann 3\nbob 7\n", "output": "bob"}],
    ),
    "fractions": (
        "from fractions import Fraction\nprint(sum(Fraction(t) for t in input().split()))",
        [{"input": "1/2 1/3\n", "output": "5/6\n"}],
    ),
    "re + collections": (
        "import re\nfrom collections import Counter\nwords = re.findall(r'[a-z]+', input().lower())\n"
        "print(Counter(words).most_common(1)[0][0])",
        [{"input": "The cat and the hat", "output": "the"}],
    ),
}


def test_correct_solutions_with_typical_imports_score_one():
    """Function-call tests and stdin/stdout tests, several sandboxes at once."""
    reward = CodeTests(timeout_s=5.0, memory_mb=256, workers=4)
    cases = list(SOLUTIONS.values()) + list(PROGRAMS.values())
    completions = [Completion(fenced(code), 20) for code, _ in cases]
    examples = [Example("task", meta={"tests": tests}) for _, tests in cases]
    assert reward(completions, examples) == [1.0] * len(cases)
    names = "top = flatten = k_smallest = fib = words = mean = hyp = counts = origin = uniq = is_prime"
    wrong = [Completion(fenced(f"{code}\n{names} = lambda *a: None"), 20) for code, _ in SOLUTIONS.values()]
    assert all(score < 1.0 for score in reward(wrong, examples[: len(SOLUTIONS)]))  # the tests discriminate


def test_a_test_that_cannot_be_split_names_the_example():
    examples = [Example("the one", meta={"tests": ["assert sorted(f(), key=lambda t: -t) == [1]"]})]
    with pytest.raises(RewardError, match=r"example 0 \(prompt: 'the one'\).*cannot check.*Lambda"):
        score_batch([build_reward("code_tests")], [Completion("", 1)], examples, timeout_s=None)


def test_the_probe_imports_a_wide_stdlib_set(monkeypatch):
    from grpolab.rewards import code

    assert {"typing", "dataclasses", "collections.abc", "decimal", "fractions", "heapq"} <= set(code.PROBE_MODULES)
    assert CodeTests(timeout_s=5.0, memory_mb=256).probe()  # the isolation it got
    # a module the sandbox cannot import (numpy lives in site-packages, which it does not see) fails it
    monkeypatch.setattr(code, "PROBE_MODULES", (*code.PROBE_MODULES, "numpy"))
    with pytest.raises(RewardError, match=r"the sandbox does not work here: .*\['numpy'\]"):
        CodeTests(timeout_s=5.0, memory_mb=256).probe()
