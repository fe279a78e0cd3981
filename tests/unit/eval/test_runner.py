"""The eval runner's pieces: K values and vote keys."""

from __future__ import annotations

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
