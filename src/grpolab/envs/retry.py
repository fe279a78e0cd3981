"""A reasoning-gym puzzle played over several turns: an answer, feedback when it is wrong, a retry.

The examples are grpolab.tasks.reasoning_gym's (data.source=reasoning_gym); the grade is the dataset's own
``score_answer`` (grpolab.tasks.reasoning_gym.gym_score) on the turn's ``<answer>`` tag. A wrong answer gets a
user message saying so and the model answers again, up to ``retries`` times. The reward is the grade of
the last answer, times ``retry_discount`` per retry used (1.0: a late right answer counts in full).
"""

from __future__ import annotations

from grpolab.envs.base import EnvStep, Message
from grpolab.types import Completion, Example

FEEDBACK = (
    "That answer is wrong. Think again and give a corrected final answer between <answer> and </answer> tags."
)


class GymRetryEnv:
    """Implements ``grpolab.envs.Environment`` for reasoning-gym examples."""

    tools: list = []

    def __init__(self, *, retries: int = 1, retry_discount: float = 1.0, threshold: float = 1.0) -> None:
        if retries < 0 or not 0 <= retry_discount <= 1:
            raise ValueError(
                f"retries must be >= 0 and retry_discount in [0, 1], got {retries}, {retry_discount}"
            )
        self.retries = retries
        self.retry_discount = retry_discount
        self.threshold = threshold
        """A score at or above it ends the episode as solved."""
        self.example: Example | None = None
        self.used = 0

    def reset(self, example: Example) -> list[Message]:
        self.example, self.used = example, 0
        if example.messages is not None:
            return [dict(m) for m in example.messages]
        return [{"role": "user", "content": example.prompt}]

    def step(self, model_turn: str) -> EnvStep:
        from grpolab.tasks.reasoning_gym import gym_score

        score = float(gym_score(Completion(model_turn, 1), self.example))
        if score >= self.threshold or self.used >= self.retries:
            return EnvStep(reward=score * self.retry_discount**self.used, done=True)
        self.used += 1
        return EnvStep([{"role": "user", "content": FEEDBACK}])
