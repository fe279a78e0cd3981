"""The ``reasoning_gym`` reward: a reasoning-gym dataset's own ``score_answer`` on the final answer.

The examples come from ``grpolab.tasks.reasoning_gym.gym_examples``, whose ``meta`` holds what is needed to
rebuild the exact dataset object (name, seed, size, params and the entry), in this process or a worker.
"""

from __future__ import annotations

from grpolab.rewards.base import PerSample, per_sample
from grpolab.rewards.rules import extract_answer_tag
from grpolab.tasks.reasoning_gym import gym_dataset
from grpolab.types import Completion, Example


def gym_score(completion: Completion, example: Example) -> float:
    """The dataset's own ``score_answer`` on the last ``<answer>`` after the reasoning (None if absent)."""
    meta = example.meta
    missing = [k for k in ("gym_dataset", "gym_seed", "gym_size", "gym_entry") if k not in meta]
    if missing:
        raise ValueError(
            f"example meta lacks {', '.join(missing)}; the reasoning_gym reward grades only examples "
            "made by grpolab.tasks.reasoning_gym.gym_examples"
        )
    dataset = gym_dataset(
        meta["gym_dataset"], size=meta["gym_size"], seed=meta["gym_seed"], params=meta.get("gym_params")
    )
    return dataset.score_answer(extract_answer_tag(completion.text), meta["gym_entry"])


def make_gym_score() -> PerSample:
    return per_sample(gym_score, name="reasoning_gym")
