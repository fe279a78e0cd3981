"""The judge's parsers on replies as judges write them, and on replies that hold no score."""

from __future__ import annotations

import math

import pytest

from grpolab.rewards.judge.parse import (
    Unparseable,
    parse_group,
    parse_number,
    parse_verdict,
    parse_yes_probability,
)


@pytest.mark.parametrize(
    "text, low, high, expected",
    [
        ("Score: 7", 0, 10, 0.7),
        ("The response is correct and concise.\n\nRating: [[8]]", 0, 10, 0.8),
        ("I'd give this 3/5.", 1, 5, 0.5),
        ("It adds 7 and 58 and gets 65, which is right.\n9", 0, 10, 0.9),
        ("**Score:** 4", 1, 5, 0.75),
        ("First impression, score: 2. On reflection the final score: 6", 0, 10, 0.6),
        ("  10.  ", 0, 10, 1.0),
        ("grade = 2.5", 0, 5, 0.5),
        ("4 out of 10, it skips the carry", 0, 10, 0.4),
    ],
)
def test_numbers_judges_write(text, low, high, expected):
    assert parse_number(text, low, high) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text",
    [
        "The answer is good.",
        "7 + 58 = 65, so the answer is right",  # numbers in prose are the judge's arithmetic, not a score
        "",
        "Score: high",
    ],
)
def test_replies_without_a_score(text):
    with pytest.raises(Unparseable, match="no score"):
        parse_number(text, 0, 10)


def test_a_score_off_the_scale_is_unparseable_not_clipped():
    with pytest.raises(Unparseable, match=r"12 is outside score_range \[0, 10\]"):
        parse_number("Score: 12", 0, 10)


def test_the_users_regex_takes_its_last_match():
    assert parse_number("draft B2 ... final B4", 0, 4, regex=r"B(\d)") == pytest.approx(1.0)
    with pytest.raises(Unparseable, match="no match of score_regex"):
        parse_number("Score: 3", 0, 4, regex=r"B(\d)")


def test_the_last_verdict_word_counts_and_words_are_whole():
    verdicts = {"correct": 1.0, "incorrect": 0.0}
    assert parse_verdict("The answer is not correct.\nVerdict: INCORRECT", verdicts) == 0.0
    assert parse_verdict("Incorrect at first sight, but on checking: Correct", verdicts) == 1.0
    assert parse_verdict("yes", {"yes": 1.0, "no": 0.0}) == 1.0
    with pytest.raises(Unparseable, match="none of the verdicts"):
        parse_verdict("Maybe; it is hard to say", verdicts)
    with pytest.raises(Unparseable):
        parse_verdict("correctness is not the point", {"correct": 1.0})  # not the whole word


def test_yes_probability_adds_every_spelling():
    top = [
        {"token": "Yes", "logprob": math.log(0.6)},
        {"token": " no", "logprob": math.log(0.2)},
        {"token": "yes", "logprob": math.log(0.1)},
        {"token": "Maybe", "logprob": math.log(0.1)},
    ]
    assert parse_yes_probability(top, ["yes"], ["no"]) == pytest.approx(0.7 / 0.9)
    only_yes = [{"token": "YES", "logprob": math.log(0.3)}, {"token": "I", "logprob": math.log(0.5)}]
    assert parse_yes_probability(only_yes, ["yes"], ["no"]) == pytest.approx(1.0)


def test_yes_probability_without_yes_or_no_or_malformed():
    with pytest.raises(Unparseable, match="none of the judge's first-token candidates"):
        parse_yes_probability([{"token": "The", "logprob": -0.1}], ["yes"], ["no"])
    with pytest.raises(Unparseable, match="not {token, logprob}"):
        parse_yes_probability([{"token": "yes", "logprob": "high"}], ["yes"], ["no"])


def test_group_scores_keep_the_groups_order_not_the_replys():
    text = "Ranking from best:\nCompletion 3: 10\nCompletion 1: 7\nCompletion 2: 3"
    assert parse_group(text, 3, 0, 10) == pytest.approx([0.7, 0.3, 1.0])
    assert parse_group("1) 4\n2) 0", 2, 0, 4) == pytest.approx([1.0, 0.0])
    assert parse_group("Scores: [2, 8, 5]", 3, 0, 10) == pytest.approx([0.2, 0.8, 0.5])


def test_a_group_reply_missing_a_completion_or_off_scale_is_unparseable():
    with pytest.raises(Unparseable, match=r"missing \[2\]"):
        parse_group("1: 7\n3: 2", 3, 0, 10)
    with pytest.raises(Unparseable, match="outside score_range"):
        parse_group("1: 7\n2: 11", 2, 0, 10)
