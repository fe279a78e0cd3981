import itertools
import random

import pytest

from grpolab.eval.metrics import (
    curve_means,
    maj_at_k,
    mean_at_n,
    pass_at_k,
    pass_maj_curves,
    pass_maj_per_problem,
)


def _brute_pass_at_k(n: int, c: int, k: int) -> float:
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_enumeration():
    for n in range(1, 8):
        for c, k in itertools.product(range(n + 1), range(1, n + 1)):
            assert pass_at_k(n, c, k) == pytest.approx(_brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_hand_values_and_large_n():
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(200, 1, 1) == pytest.approx(0.005)
    assert pass_at_k(1000, 3, 500) == pytest.approx(1 - (500 * 499 * 498) / (1000 * 999 * 998))


def test_pass_at_k_errors():
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 0)


ANSWERS = ["1", "2", "1", "3"]
CORRECT = [True, False, True, False]


def test_maj_at_k_hand_values():
    assert maj_at_k(ANSWERS, CORRECT, 4) == 1.0  # "1" wins 2-1-1
    assert maj_at_k(ANSWERS, CORRECT, 3) == 1.0  # one subset ["1", "2", "1"]
    assert maj_at_k(ANSWERS, CORRECT, 2) == 0.5  # two ties, each half correct
    assert maj_at_k(ANSWERS, CORRECT, 1) == 0.5


def test_maj_at_k_unparsed_answers_do_not_vote():
    answers = [None, None, "7", "8", "8", "7"]
    correct = [False, False, True, False, False, True]
    assert maj_at_k(answers, correct, 2) == pytest.approx((0 + 0.5 + 0.5) / 3)
    assert maj_at_k(answers, correct, 3) == pytest.approx((1 + 0) / 2)  # [None, None, "7"] -> "7"
    assert maj_at_k(answers, correct, 6) == 0.5


def test_maj_at_k_uses_disjoint_consecutive_subsets_only():
    assert maj_at_k(["a", "a", "b", "b", "a"], [True, True, False, False, True], 2) == 0.5


def test_maj_at_one_is_mean_correctness():
    rng = random.Random(0)
    truth = {"a": True, "b": False, "c": False, None: False}
    answers = [rng.choice(["a", "b", "c", None]) for _ in range(37)]
    correct = [truth[a] for a in answers]
    assert maj_at_k(answers, correct, 1) == pytest.approx(mean_at_n(correct))


def test_maj_at_k_errors():
    with pytest.raises(ValueError, match="both correct and incorrect"):
        maj_at_k(["1", "1"], [True, False], 1)
    with pytest.raises(ValueError, match="None"):
        maj_at_k([None, "1"], [True, False], 1)
    with pytest.raises(ValueError, match="same length"):
        maj_at_k(["1"], [True, False], 1)
    with pytest.raises(ValueError, match="k <= n"):
        maj_at_k(ANSWERS, CORRECT, 5)


def test_mean_at_n():
    assert mean_at_n([True, False, False, True]) == 0.5
    with pytest.raises(ValueError):
        mean_at_n([])


def test_pass_maj_curves():
    problems = [(ANSWERS, CORRECT), (["y", "y", "y", "x"], [True, True, True, False])]
    curves = pass_maj_curves(problems, [1, 2])
    assert curves["pass"] == pytest.approx({1: (0.5 + 0.75) / 2, 2: (5 / 6 + 1.0) / 2})
    assert curves["maj"] == pytest.approx({1: (0.5 + 0.75) / 2, 2: (0.5 + 0.75) / 2})
    with pytest.raises(ValueError):
        pass_maj_curves([], [1])


def test_pass_maj_per_problem_keeps_each_problem_in_order():
    problems = [(ANSWERS, CORRECT), (["y", "y", "y", "x"], [True, True, True, False])]
    values = pass_maj_per_problem(problems, [1, 2])
    assert values["pass"][2] == pytest.approx([5 / 6, 1.0])
    assert values["maj"][1] == pytest.approx([0.5, 0.75])
    for kind, curve in pass_maj_curves(problems, [1, 2]).items():
        assert curve_means(values)[kind] == pytest.approx(curve)


def test_format_errors_are_wrong_samples_the_blind_grader_calls_right_or_without_an_answer():
    from grpolab.eval.metrics import format_errors

    correct = [True, False, False, False]
    answers = ["42", "", "43", "43"]
    assert format_errors(correct, answers) == [False, True, False, False]  # without a blind grader: no answer only
    assert format_errors(correct, answers, [True, False, True, False]) == [False, True, True, False]
    with pytest.raises(ValueError, match="format_errors"):
        format_errors(correct, answers[:3])


def test_blind_votes_go_to_the_reference_and_never_mix_grades():
    from grpolab.eval.metrics import blind_vote_keys

    answers = ["forty-two", "42", "43", "42", ""]
    blind = [True, True, False, False, False]  # the 4th: "42" extracted, yet graded wrong (e.g. an echo)
    keys = blind_vote_keys(answers, blind, "42")
    assert keys == ["42", "42", "43", "42 [graded wrong]", ""]
    # maj@5 over these: "42" has 2 votes, the rest 1 each -> right; maj@1 is the mean blind grade
    assert maj_at_k(keys, blind, 5) == 1.0 and maj_at_k(keys, blind, 1) == pytest.approx(2 / 5)
