"""The process-reward contract: one finite float per step, errors naming the example, the registry."""

from __future__ import annotations

import pytest

from grpolab.config import ConfigError
from grpolab.rewards import RewardError
from grpolab.rewards.step_rewards import build_process_reward, per_step, score_steps
from grpolab.types import Example

EXAMPLES = [Example("first question", "1"), Example("second question", "2")]
STEPS = [["a,", "b"], ["c"]]


def step_lengths(steps, example, *, scale=1.0):
    return [scale * len(s) for s in steps]


def test_per_step_rule_scores_every_step():
    assert score_steps(per_step(step_lengths), STEPS, EXAMPLES, timeout_s=1.0) == [[2.0, 1.0], [1.0]]


@pytest.mark.parametrize(
    ("fn", "pattern"),
    [
        (
            lambda steps, e: [0.0],
            r"returned \[0.0\] for example 0 \(prompt: 'first question'\), which has 2 steps",
        ),
        (lambda steps, e: [float("nan")] * len(steps), r"returned nan for a step of example 0"),
        (
            lambda steps, e: [1 / 0],
            r"'bad' raised ZeroDivisionError on example 0 \(prompt: 'first question'\)",
        ),
    ],
)
def test_bad_step_rewards_name_the_example(fn, pattern):
    with pytest.raises(RewardError, match=pattern):
        score_steps(per_step(fn, name="bad"), STEPS, EXAMPLES, timeout_s=None)


def test_a_batched_reward_with_the_wrong_number_of_rows():
    class Short:
        name = "short"

        def __call__(self, steps, examples):
            return [[0.0, 0.0]]

    with pytest.raises(RewardError, match="returned 1 rows for 2 completions"):
        score_steps(Short(), STEPS, EXAMPLES, timeout_s=None)


def test_registry_and_user_rules():
    reward = build_process_reward(f"{__name__}:step_lengths", {"scale": 2.0})
    assert reward.name == "step_lengths"
    assert score_steps(reward, STEPS, EXAMPLES, timeout_s=None) == [[4.0, 2.0], [2.0]]
    with pytest.raises(ConfigError, match="unknown process reward 'nope'.*known: reward_model"):
        build_process_reward("nope")
    with pytest.raises(ConfigError, match="reward.process.name: .*has no attribute 'missing'"):
        build_process_reward(f"{__name__}:missing")
