"""The reasoning-gym puzzle over several turns: feedback on a wrong answer, one retry."""

from __future__ import annotations

import pytest

pytest.importorskip("reasoning_gym")

from grpolab.envs import ToolLimits, build_environment  # noqa: E402
from grpolab.envs.retry import FEEDBACK  # noqa: E402
from grpolab.tasks.reasoning_gym import gym_examples  # noqa: E402


@pytest.fixture(scope="module")
def example():
    return gym_examples("basic_arithmetic", size=1, seed=3, template="none")[0]


def test_a_right_first_answer_ends_with_reward_one(example):
    env = build_environment("gym_retry", {}, ToolLimits())()
    assert env.reset(example)[0]["content"] == example.prompt
    step = env.step(f"<answer>{example.answer}</answer>")
    assert step.done and step.reward == 1.0


def test_a_wrong_answer_gets_feedback_and_one_retry(example):
    env = build_environment("gym_retry", {"retries": 1, "retry_discount": 0.5}, ToolLimits())()
    env.reset(example)
    first = env.step("<answer>-999999</answer>")
    assert not first.done and first.messages == [{"role": "user", "content": FEEDBACK}]
    second = env.step(f"<answer>{example.answer}</answer>")
    assert second.done and second.reward == 0.5  # right on the retry, discounted once
    env.reset(example)
    env.step("<answer>-999999</answer>")
    last = env.step("<answer>-999998</answer>")
    assert last.done and last.reward == 0.0  # retries spent
