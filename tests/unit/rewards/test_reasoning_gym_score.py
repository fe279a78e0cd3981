"""The reasoning-gym reward (rewards/reasoning_gym.py) on examples from the reasoning-gym task."""

import pytest

from grpolab.rewards import RewardError, build_reward, score_batch
from grpolab.tasks import reasoning_gym as gym
from grpolab.types import Completion, Example


@pytest.fixture(scope="module")
def examples():
    return gym.gym_examples("chain_sum", size=4, seed=3, params={"min_terms": 2, "max_terms": 3})


def grade(examples, texts):
    reward = build_reward("reasoning_gym")
    completions = [Completion(t, 5) for t in texts]
    return score_batch([reward], completions, examples, timeout_s=None).components["reasoning_gym"]


def test_gym_score(examples):
    ex = examples[0]
    wrong = str(int(ex.answer) + 1)
    texts = [
        f"<think>adding</think><answer>{ex.answer}</answer>",
        f"<answer>{wrong}</answer>",
        ex.answer,  # no tag
        f"<think><answer>{ex.answer}</answer></think>",  # only inside the think block
    ]
    scores = grade([ex] * 4, texts)
    assert scores[0] == 1.0 and scores[1] < 1.0 and scores[2] == 0.0 and scores[3] == 0.0


def test_gym_score_rebuilds_dataset_from_meta(examples, monkeypatch):
    monkeypatch.setattr(gym, "_DATASETS", {})  # as in a fresh process
    assert grade(examples[:1], [f"<answer>{examples[0].answer}</answer>"]) == [1.0]


def test_gym_score_needs_gym_meta():
    with pytest.raises(RewardError, match="example meta lacks gym_dataset.*gym_examples"):
        grade([Example("q", "1")], ["<answer>1</answer>"])
