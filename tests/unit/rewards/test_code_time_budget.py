"""code_tests under programs that loop forever: each is killed at its own timeout_s and scores 0, the count is
reported (rewards/code_tests/timed_out), the batch is bounded by a budget derived from timeout_s, the
workers and the cases rather than reward.timeout_s, and only a reward that hangs as a whole stops the run."""

from __future__ import annotations

import time

import pytest

from grpolab.rewards import RewardError, WeightedReward, score_batch
from grpolab.rewards.code import CodeTests
from grpolab.types import Completion, Example

LOOP = "```python\ndef add(a, b):\n    while True:\n        pass\n```"
GOOD = "```python\ndef add(a, b):\n    return a + b\n```"
ASSERTS = Example(prompt="p", answer="", meta={"tests": ["assert add(1, 2) == 3"]})
IO = Example(prompt="p", answer="", meta={"tests": [{"input": str(i), "output": str(i)} for i in range(3)]})


def test_the_budget_is_derived_from_timeout_workers_and_cases():
    reward = CodeTests(timeout_s=1.0, workers=4)
    twelve = [Completion(text=LOOP, num_tokens=1)] * 12
    # ceil(12 / 4) = 3 rounds x 1 case x (1 s + 0.5 s start-up + 0.5 s slack) + 10 s per call
    assert reward.time_budget_s(twelve, [ASSERTS] * 12) == pytest.approx(3 * 1 * 2.0 + 10)
    # stdin/stdout: every case is one program, 3 cases
    assert reward.time_budget_s(twelve, [ASSERTS] * 11 + [IO]) == pytest.approx(3 * 3 * 2.0 + 10)
    assert CodeTests(timeout_s=1.0, workers=5).time_budget_s(twelve, [ASSERTS] * 12) == pytest.approx(3 * 2.0 + 10)


def test_looping_completions_score_zero_are_counted_and_do_not_stop_the_batch():
    reward = CodeTests(timeout_s=0.5, workers=2)
    texts = [LOOP, GOOD, LOOP, LOOP]
    t0 = time.monotonic()
    # reward.timeout_s = 0.3 s is far below what 3 killed programs take: the derived budget holds instead
    result = score_batch([WeightedReward(reward, 1.0)], [Completion(text=t, num_tokens=1) for t in texts],
                         [ASSERTS] * 4, timeout_s=0.3)  # fmt: skip
    assert result.components["code_tests"] == [0.0, 1.0, 0.0, 0.0]
    assert result.counts == {"rewards/code_tests/timed_out": 3.0}
    assert time.monotonic() - t0 < reward.time_budget_s([None] * 4, [ASSERTS] * 4)


class _Hangs:
    """A reward that bounds its items (a budget) but hangs as a whole past it."""

    name = "hangs"
    in_process = True

    def time_budget_s(self, completions, examples) -> float:
        return 0.2

    def __call__(self, completions, examples):
        time.sleep(3)
        return [0.0] * len(completions)


def test_a_reward_that_hangs_as_a_whole_still_stops_with_the_timeout_error():
    with pytest.raises(RewardError, match=r"reward 'hangs' took longer than 0.2 s .*raise reward.timeout_s"):
        score_batch([WeightedReward(_Hangs(), 1.0)], [Completion(text="x", num_tokens=1)], [ASSERTS], timeout_s=0.1)
