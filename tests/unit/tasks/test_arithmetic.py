"""The arithmetic task's question style (a chat model is asked in words)."""

from collections import Counter

import pytest

from grpolab.tasks.arithmetic import arithmetic_examples, make_problem


def test_equation_style_is_unchanged():
    first = arithmetic_examples(size=3, seed=0, digits=3)
    assert first[0] == make_problem(first[0].meta["a"], first[0].meta["b"], digits=3)
    assert first[0].prompt.endswith("=") and len(first[0].answer) == 4


def test_question_style_asks_in_words_with_the_plain_sum():
    examples = arithmetic_examples(size=400, seed=0, digits=2, style="question", min_digits=1)
    e = examples[0]
    a, b = e.meta["a"], e.meta["b"]
    assert e.prompt == f"What is {a} + {b}? Answer with just the number."
    assert e.answer == str(a + b)
    assert len({(x.meta["a"], x.meta["b"]) for x in examples}) == 400
    # the digit count is drawn first: about half the operands have 1 digit (uniform would give 10%)
    digits = Counter(len(str(x.meta[k])) for x in examples for k in "ab")
    assert set(digits) == {1, 2} and 0.4 < digits[1] / 800 < 0.6
    assert arithmetic_examples(size=5, seed=0, digits=2, style="question", min_digits=1)[:1] == examples[:1]


def test_question_style_with_fixed_digits_and_custom_text():
    examples = arithmetic_examples(size=50, seed=1, digits=2, style="question", question="{a} plus {b}?")
    assert all(10 <= x.meta[k] <= 99 for x in examples for k in "ab")
    assert examples[0].prompt == f"{examples[0].meta['a']} plus {examples[0].meta['b']}?"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"style": "words"}, "choose 'equation'"),
        ({"min_digits": 1}, "min_digits applies to style=question"),
        ({"style": "question", "min_digits": 3}, "need 1 <= min_digits <= digits"),
        ({"style": "question", "question": "What is {a}?"}, r"must hold the operands' places \{a\} and \{b\}"),
    ],
)
def test_bad_arithmetic_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        arithmetic_examples(size=5, seed=0, digits=2, **kwargs)
