import time

import pytest

from grpolab.rewards import rules
from grpolab.types import Completion, Example

LONG = "x" * 100_000


def c(text: str, num_tokens: int = 1, finish_reason: str = "stop") -> Completion:
    return Completion(text, num_tokens, finish_reason)


EX = Example("What is 6 * 7?", "42")


@pytest.mark.parametrize(
    ("text", "extract", "expected"),
    [
        ("<think>easy</think><answer>42</answer>", "answer_tag", 1.0),
        ("<answer> 42 \n</answer>", "answer_tag", 1.0),
        ("<answer>41</answer>", "answer_tag", 0.0),
        ("<answer>42.0</answer>", "answer_tag", 0.0),  # exact, not numeric
        ("42", "answer_tag", 0.0),  # no tag
        ("", "answer_tag", 0.0),
        ("<answer>1</answer> then <answer>42</answer>", "answer_tag", 1.0),  # last one counts
        ("<answer>42</answer> then <answer>1</answer>", "answer_tag", 0.0),
        ("<answer><answer>42</answer></answer>", "answer_tag", 1.0),  # nested: innermost
        ("<answer>42</answer> <answer>", "answer_tag", 1.0),  # trailing unclosed tag ignored
        ("</answer>42<answer>", "answer_tag", 0.0),  # wrong order
        ("<think><answer>42</answer></think><answer>7</answer>", "answer_tag", 0.0),
        ("<think>it is <answer>42</answer></think> no answer", "answer_tag", 0.0),  # only in think
        ("<answer>四十二</answer>", "answer_tag", 0.0),
        (LONG + "<answer>42</answer>", "answer_tag", 1.0),
        ("  42\n", "none", 1.0),
        ("the answer is 42", "none", 0.0),
        ("work\n\n42\n  \n", "last_line", 1.0),
        ("42\nwork", "last_line", 0.0),
        ("", "last_line", 0.0),
    ],
)
def test_exact_match(text, extract, expected):
    assert rules.exact_match(c(text), EX, extract=extract) == expected


def test_exact_match_needs_answer_and_valid_mode():
    with pytest.raises(ValueError, match=r"which reward 'exact_match' needs: set data.answer_field.*fill it in every row"):
        rules.exact_match(c("<answer>1</answer>"), Example("q"))
    with pytest.raises(ValueError, match="choose one of answer_tag, none, last_line"):
        rules.make_exact_match(extract="boxed")


@pytest.mark.parametrize(
    ("text", "prefilled", "expected"),
    [
        ("<think>reason</think><answer>42</answer>", False, 1.0),
        ("  <think>\nreason\n</think>\n\n<answer>\n42\n</answer>\n", False, 1.0),
        ("<think></think><answer></answer>", False, 1.0),  # tags alone define the format
        ("<think>ünïcødé 🤔</think> <answer>४२</answer>", False, 1.0),
        ("", False, 0.0),
        ("<answer>42</answer>", False, 0.0),
        ("<think>reason</think>", False, 0.0),
        ("<answer>42</answer><think>reason</think>", False, 0.0),  # wrong order
        ("<think>reason</think><answer>42</answer> trailing", False, 0.0),
        ("preamble <think>reason</think><answer>42</answer>", False, 0.0),
        ("<think>reason</think> text <answer>42</answer>", False, 0.0),
        ("<think>a</think><think>b</think><answer>42</answer>", False, 0.0),
        ("<think>a</think><answer>1</answer><answer>2</answer>", False, 0.0),
        ("<think><think>a</think></think><answer>42</answer>", False, 0.0),
        ("<think>a<answer>42</answer></think>", False, 0.0),  # answer only inside think
        ("<think>a</think><answer>42", False, 0.0),
        ("<think>" + LONG + "</think><answer>42</answer>", False, 1.0),
        ("<think>" + LONG, False, 0.0),
        ("reason</think><answer>42</answer>", True, 1.0),
        ("\nreason\n</think>\n<answer>42</answer>\n", True, 1.0),
        ("<think>reason</think><answer>42</answer>", True, 0.0),  # opens a second think block
        ("<think>reason</think><answer>42</answer>".replace("<think>", ""), False, 0.0),
        ("reason</think> trailing <answer>42</answer>", True, 0.0),
    ],
)
def test_r1_format(text, prefilled, expected):
    assert rules.r1_format(c(text), EX, prefilled_think=prefilled) == expected


@pytest.mark.parametrize(
    ("num_tokens", "expected"),
    [(0, 0.0), (16, 0.0), (17, -0.25), (18, -0.5), (20, -1.0), (21, -1.0), (10_000, -1.0)],
)
def test_soft_overlong_dapo_oracle(num_tokens, expected):
    # docs/algorithms.md 7.7: L_max = 20, L_cache = 4.
    assert rules.soft_overlong(c("", num_tokens), EX, max_length=20, cache_length=4) == pytest.approx(
        expected
    )


@pytest.mark.parametrize(("max_length", "cache_length"), [(20, 0), (20, 21), (20, -1)])
def test_soft_overlong_rejects_bad_args(max_length, cache_length):
    with pytest.raises(ValueError, match="0 < cache_length <= max_length"):
        rules.make_soft_overlong(max_length=max_length, cache_length=cache_length)


@pytest.mark.parametrize(("num_tokens", "expected"), [(0, 0.0), (50, -0.05), (100, -0.1), (200, -0.2)])
def test_length_penalty(num_tokens, expected):
    got = rules.length_penalty(c("", num_tokens), EX, coef=0.1, max_length=100)
    assert got == pytest.approx(expected)


def test_length_penalty_rejects_bad_max_length():
    with pytest.raises(ValueError, match="positive completion-token limit"):
        rules.make_length_penalty(coef=0.1, max_length=0)


def test_truncation_penalty():
    assert rules.truncation_penalty(c("x", 5, "length"), EX, penalty=0.5) == -0.5
    assert rules.truncation_penalty(c("x", 5, "stop"), EX, penalty=0.5) == 0.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{42}", "42"),
        ("a \\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{", None),
        ("\\boxed{1} and \\boxed{2", "1"),  # unclosed last box: the previous closed one
        ("\\boxed{{a}{b}}", "{a}{b}"),
        ("no box", None),
        ("}}}\\boxed{7}{{{", "7"),
    ],
)
def test_extract_boxed(text, expected):
    assert rules.extract_boxed(text) == expected


def test_extractors_are_fast_on_adversarial_input():
    nasty = "<answer>" * 12_500 + "\\boxed{" * 14_000 + "{" * 50_000
    start = time.perf_counter()
    assert rules.extract_answer_tag(nasty) is None
    assert rules.extract_boxed(nasty) is None
    assert rules.r1_format(c(nasty), EX) == 0.0
    assert time.perf_counter() - start < 2.0


def test_factories_build_named_batched_rewards():
    reward = rules.make_soft_overlong(max_length=20, cache_length=4)
    assert reward.name == "soft_overlong"
    assert reward([c("", 18), c("", 10)], [EX, EX]) == [pytest.approx(-0.5), 0.0]
    assert rules.make_r1_format(prefilled_think=True)([c("r</think><answer>1</answer>")], [EX]) == [1.0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", 1.0),
        ("6 * 7 = 42", 1.0),  # the last number: the restated operands do not count
        ("6 * 7 = 42.", 1.0),
        ("The answer is 42!\n", 1.0),
        ("42 is 6 * 7", 0.0),  # 7 is the last number
        ("6 * 7 = 41", 0.0),
        ("forty-two", 0.0),
        ("", 0.0),
        ("<think>maybe 42</think> 41", 0.0),  # only after the reasoning
        ("6 * 7 = 42.0", 0.0),  # exact, not numeric
    ],
)
def test_exact_match_last_number(text, expected):
    assert rules.exact_match(c(text), EX, extract="last_number") == expected


def test_last_number_reads_thousands_commas_and_signs():
    assert rules.extract_last_number("so 1,000 + 42 = 1,042.") == "1042"
    assert rules.extract_last_number("5 - 9 = -4") == "-4"
    assert rules.extract_last_number("no digits") is None


def test_only_last_number_declares_its_extraction_for_voting():
    assert rules.make_exact_match(extract="last_number").extract_answer("7 + 5 = 12") == "12"
    assert not hasattr(rules.make_exact_match(extract="none"), "extract_answer")


SUM = Example("What is 17 + 25? Answer with just the number.", "42")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", 1.0),
        ("The sum of 17 and 25 is 42, I think. Let me check: 17 + 25 = 43", 1.0),  # anywhere, not only last
        ("42.0", 1.0),  # numerically
        ("<think>42</think> no idea", 1.0),  # reasoning included: blind to where it stands
        ("17 + 25 = 43", 0.0),
        ("forty-two", 0.0),  # a number written in words is not the number
        ("142", 0.0),  # a number, not a digit string inside one
        ("", 0.0),
    ],
)
def test_answer_anywhere_finds_the_number_wherever_it_stands(text, expected):
    assert rules.answer_anywhere(c(text), SUM) == expected


def test_answer_anywhere_reads_thousands_commas_and_words():
    assert rules.answer_anywhere(c("That makes 1,042."), Example("What is 1000 + 42?", "1042")) == 1.0
    paris = Example("Capital of France?", "Paris")
    assert rules.answer_anywhere(c("It is  PARIS, of course"), paris) == 1.0
    assert rules.answer_anywhere(c("Lyon"), paris) == 0.0


def test_an_answer_the_prompt_holds_counts_only_as_the_last_number():
    """0 + 7: a reply that restates the question holds 7 without answering it."""
    zero = Example("What is 0 + 7? Answer with just the number.", "7")
    assert rules.answer_anywhere(c("0 + 7 = 8"), zero) == 0.0
    assert rules.answer_anywhere(c("0 + 7 = 7"), zero) == 1.0
    assert rules.answer_anywhere(c("7"), zero) == 1.0
    # 7 is a digit of 17, not a number of the prompt: it counts anywhere
    assert rules.answer_anywhere(c("7, or 8"), Example("What is 17 - 10?", "7")) == 1.0
    word = Example("Repeat the word cat.", "cat")
    assert rules.answer_anywhere(c("cat"), word) == 1.0
    assert rules.answer_anywhere(c("You asked me to repeat the word cat.\nDog"), word) == 0.0


def test_answer_anywhere_is_registered_and_needs_the_answer():
    from grpolab.rewards import build_reward

    reward = build_reward("answer_anywhere").reward
    assert reward.name == "answer_anywhere" and reward([c("x 42"), c("4 2")], [SUM, SUM]) == [1.0, 0.0]
    with pytest.raises(ValueError, match="answer_anywhere"):
        rules.answer_anywhere(c("42"), Example("What is 17 + 25?", None))
