"""The eval runner's pieces: K values and vote keys."""

from __future__ import annotations

import pytest

from grpolab.eval.runner import default_ks, vote_keys


def test_default_ks():
    assert default_ks(1) == [1]
    assert default_ks(64) == [1, 2, 4, 8, 16, 32, 64]
    assert default_ks(48) == [1, 2, 4, 8, 16, 32, 48]


def test_vote_keys_extract_the_answer_and_split_disagreeing_grades():
    texts = ["<think>x</think><answer> 12 </answer>", "\\boxed{12}", " 12\n", "<answer>12</answer> junk", "7"]
    correct = [True, True, True, False, False]
    assert vote_keys(texts, correct) == ["12", "12", "12", "12 [graded wrong]", "7"]


def test_votes_follow_the_grading_rewards_extraction():
    from grpolab.eval.runner import Grader
    from grpolab.rewards import build_reward

    texts = ["7 + 5 = 12", "12", "The sum is 12.", "7 + 5 = 13"]
    grader = Grader([build_reward("exact_match", kwargs={"extract": "last_number"})], 0.5, None)
    assert vote_keys(texts, [True, True, True, False], grader.answer) == ["12", "12", "12", "13"]
    plain = Grader([build_reward("exact_match", kwargs={"extract": "none"})], 0.5, None)
    assert plain.answer("7 + 5 = 12") == "7 + 5 = 12"  # no declared extraction: the whole final text


def _completions(texts, g):
    import torch

    from grpolab.types import Completions

    n = len(texts)
    return Completions(
        prompt_ids=[[1]] * n, completion_ids=torch.ones(n, 1, dtype=torch.long), completion_mask=torch.ones(n, 1, dtype=torch.bool),
        logprobs=torch.zeros(n, 1), texts=list(texts), finish_reasons=["stop"] * n, num_generations=g,
    )


def test_both_gradings_give_their_own_pass_and_maj_curves():
    """Two prompts x 4 samples, graded by the last number and by the answer anywhere, worked by hand."""
    from grpolab.eval.metrics import curve_means, pass_maj_per_problem
    from grpolab.eval.runner import Grader
    from grpolab.rewards import build_reward
    from grpolab.types import Example

    grader = Grader([build_reward("exact_match", kwargs={"extract": "last_number"})], 0.5, None,
                    blind=build_reward("answer_anywhere"))
    examples = [Example("What is 17 + 25?", "42"), Example("What is 3 + 4?", "7")]
    texts = ["42", "It is 42, not 41", "forty-two", "17 + 25 = 43",  # strict: 1 of 4; blind: 2 of 4
             "Seven.", "the sum 7 is odd: 1", "8", "I think 8"]     # strict: 0 of 4; blind: 1 of 4
    graded = grader.grade_all(_completions(texts, 4), examples)
    assert graded.correct == [True, False, False, False, False, False, False, False]
    assert graded.blind == [True, True, False, False, False, True, False, False]
    assert graded.answers == ["42", "41", "", "43", "", "1", "8", "8"]
    assert graded.format_errors == [False, True, True, False, True, True, False, False]
    strict, blind = graded.votes(examples, 4)
    assert blind[0][0] == ["42", "42", "", "43"] and blind[1][0] == ["", "7", "8", "8"]
    s, b = (curve_means(pass_maj_per_problem(v, [1, 4])) for v in (strict, blind))
    assert s["pass"] == {1: pytest.approx(1 / 8), 4: pytest.approx(1 / 2)}
    assert b["pass"] == {1: pytest.approx(3 / 8), 4: pytest.approx(1.0)}
    # maj@4: prompt 1 votes 42 twice (right) under the blind grader, 42/41/""/43 tied under the strict one (1 of 4
    # winners right); prompt 2 votes 8 twice (wrong) under both
    assert s["maj"][4] == pytest.approx((1 / 4 + 0) / 2) and b["maj"][4] == pytest.approx((1 + 0) / 2)
