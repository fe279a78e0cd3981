import time

import pytest

from grpolab.rewards import RewardError, WeightedReward, score_batch
from grpolab.rewards.math_answer import make_math_accuracy, math_accuracy, prediction_text
from grpolab.types import Completion, Example


def score(text: str, gold: str) -> float:
    return math_accuracy(Completion(text, 1), Example("q", gold))


@pytest.mark.parametrize(
    ("text", "gold", "expected"),
    [
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("<answer>\\frac{1}{2}</answer>", "0.5", 1.0),
        ("<answer>0.5</answer>", "\\frac{1}{2}", 1.0),
        ("<answer>1/2</answer>", "0.5", 1.0),
        ("$x=3$", "3", 1.0),
        ("<answer>$x = 3$</answer>", "3", 1.0),
        ("The answer is 3.", "3", 1.0),  # whole-text fallback
        ("<answer>\\sqrt{2}</answer>", "\\sqrt{2}", 1.0),  # bare LaTeX needs $...$ to parse
        ("<answer>2\\pi</answer>", "2\\pi", 1.0),
        ("<answer>2\\pi</answer>", "2", 0.0),
        ("<answer>\\dfrac{3}{4}</answer>", "0.75", 1.0),
        ("<answer>1,000</answer>", "1000", 1.0),
        ("<answer>4</answer>", "3", 0.0),
        ("<think>maybe \\boxed{3}</think><answer>4</answer>", "3", 0.0),
        ("<think>it is <answer>3</answer></think> I give up", "3", 0.0),  # answer only in think
        ("<answer>3</answer> \\boxed{4}", "3", 1.0),  # tag beats box
        ("\\boxed{4} <answer>3</answer>", "3", 1.0),
        ("\\boxed{", "3", 0.0),
        ("", "3", 0.0),
        ("<answer></answer>", "3", 0.0),
        ("<answer>三</answer>", "3", 0.0),
        ("<answer><answer>3</answer></answer>", "3", 1.0),
        ("x" * 100_000 + " \\boxed{3}", "3", 1.0),
        ("\\boxed{3} " + "x" * 100_000, "3", 1.0),  # the box is found before the cut
        ("3 " + "1" * 100_000, "3", 0.0),  # only the last 1,000 characters are parsed
    ],
)
def test_math_accuracy(text, gold, expected):
    assert score(text, gold) == expected


def test_prediction_text_preference():
    assert prediction_text("\\boxed{1} <answer>2</answer>") == ("2", True)
    assert prediction_text("\\boxed{1} text") == ("1", True)
    assert prediction_text("<think>\\boxed{1}</think> 5") == (" 5", False)


def test_gold_problems_are_clear():
    with pytest.raises(ValueError, match=r"no reference answer \(data.answer_field\), which reward 'math_accuracy' needs"):
        math_accuracy(Completion("1", 1), Example("q"))
    with pytest.raises(ValueError, match="cannot parse the reference answer.*exact_match"):
        score("<answer>1</answer>", "")


def test_factory_checks_options():
    with pytest.raises(ValueError, match="whole seconds"):
        make_math_accuracy(timeout_s=0.5)
    with pytest.raises(ValueError, match="max_chars"):
        make_math_accuracy(max_chars=0)


def test_works_in_score_batch_worker_thread():
    # math-verify's signal.alarm raises outside the main thread; the reward must disable it there.
    reward = WeightedReward(make_math_accuracy())
    completions = [Completion("\\boxed{\\frac{1}{2}}", 5), Completion("<answer>7</answer>", 5)]
    examples = [Example("q1", "0.5"), Example("q2", "8")]
    start = time.perf_counter()
    result = score_batch([reward], completions, examples, timeout_s=10.0)
    assert result.components["math_accuracy"] == [1.0, 0.0]
    assert time.perf_counter() - start < 5.0


def test_bad_gold_in_batch_names_example():
    reward = WeightedReward(make_math_accuracy())
    with pytest.raises(RewardError, match=r"on example 1 \(prompt: 'q2'\).*cannot parse the reference"):
        score_batch(
            [reward], [Completion("1", 1)] * 2, [Example("q1", "1"), Example("q2", "")], timeout_s=5.0
        )
