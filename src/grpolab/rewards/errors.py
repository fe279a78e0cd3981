"""The errors of a reward (one sample's, and the kinds of failure they are counted as), and how an example is
named in messages.

Apart from the contract (rewards/base.py) so that the worker that runs rewards in another process
(rewards/worker.py), which base.py itself uses, can rebuild the error it sends back.
"""

from __future__ import annotations

from grpolab.errors import RewardError, TrainingError
from grpolab.types import Example


def describe_example(example: Example, index: int, width: int = 80) -> str:
    """``example 3 (prompt: '...')``, the prompt cut to about ``width`` characters.

    Templated prompts share their first few hundred characters, so the head and the tail are shown.
    """
    prompt = " ".join(example.prompt.split())
    if len(prompt) > width:
        head = width * 3 // 8
        prompt = prompt[:head] + " ... " + prompt[-(width - head - 5) :]
    return f"example {index} (prompt: {prompt!r})"


class SampleError(RewardError):
    """A per-sample reward raised on one example; chained from the original exception."""

    def __init__(self, name: str, index: int, example: Example, exc: Exception) -> None:
        super().__init__(
            f"reward '{name}' raised {type(exc).__name__} on {describe_example(example, index)}: {exc}. "
            "Fix the reward function, or the dataset row it cannot handle."
        )
        self.name, self.index, self.example, self.exc = name, index, example, exc

    def __reduce__(self):  # pickled by its fields (sent back from a reward's worker process)
        return (type(self), (self.name, self.index, self.example, self.exc), {"__notes__": getattr(self, "__notes__", [])})


class RewardTimedOut(RewardError):
    """A reward call took longer than its bound (reward.timeout_s, or the reward's own time budget)."""

    failure_kind = "reward_timeout"


class RewardNotFinite(RewardError):
    """A reward returned NaN or an infinity (or a total too large for a float)."""

    failure_kind = "reward_nan"


class RewardMalformed(RewardError):
    """A reward returned nothing usable: not a list, the wrong number of values, or a value that is no number."""

    failure_kind = "reward_invalid"


class RewardServiceDown(TrainingError):
    """A reward's service (a judge's endpoint) cannot be reached at all, or the server the run started for it has
    exited: no sample of any prompt can be scored, so the run stops at once with one line naming the endpoint
    instead of dropping every group step after step. rewards.base lets it through rather than counting it as a
    failed sample."""
