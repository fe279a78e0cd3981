"""rewards.isolate.score_groups: a failed reward call is made again on each group alone (reward.max_retries); the
groups that still fail carry their failure, with no value at all (never a 0), each kind under its own name."""

from __future__ import annotations

import math
import time

import pytest

from grpolab.rewards import WeightedReward, per_sample
from grpolab.rewards.isolate import score_groups
from grpolab.sandbox.runner import SandboxError
from grpolab.types import Completion, Example, Failure

G = 2
EXAMPLES = [Example(f"q{k}", "1") for k in range(3) for _ in range(G)]
COMPLETIONS = [Completion(text, 1) for _ in range(3) for text in ("1", "0")]
"""Each group: one right answer, one wrong: rewards [1, 0]."""


class Flaky:
    """A batched reward that fails on prompt ``bad`` in the way ``how`` says; counts its calls and what it saw."""

    in_process = True  # bounded by a thread, not a worker process (the timeout case)

    def __init__(self, how: str, bad: str = "q1", first_call_only: bool = False):
        self.name, self.how, self.bad, self.first_call_only = "judge", how, bad, first_call_only
        self.calls: list[list[str]] = []

    def __call__(self, completions, examples):
        self.calls.append([e.prompt for e in examples])
        values = [1.0 if c.text == e.answer else 0.0 for c, e in zip(completions, examples, strict=True)]
        hit = any(self.bad in (e.prompt, "*") for e in examples) and not (self.first_call_only and len(self.calls) > 1)
        if not hit:
            return values
        if self.how == "raise":
            raise ConnectionResetError("the judge's server is gone")
        if self.how == "nan":
            return [math.nan if e.prompt == self.bad else v for e, v in zip(examples, values, strict=True)]
        if self.how == "none":
            return None
        if self.how == "too_few":
            return values[:-1]
        if self.how == "sandbox":
            raise SandboxError("the sandbox process exited with status 1 before running the code")
        if self.how == "hang":
            time.sleep(5)
            return values
        raise AssertionError(self.how)


def _score(reward, **kwargs):
    kwargs = {"timeout_s": None, "max_retries": 1, **kwargs}
    return score_groups([WeightedReward(reward)], COMPLETIONS, EXAMPLES, group_size=G, **kwargs)


@pytest.mark.parametrize(
    ("how", "kind", "said"),
    [
        ("raise", "reward_error", "'judge' raised ConnectionResetError on a batch of 2 (first example 2 (prompt: 'q1')): the"),
        ("nan", "reward_nan", "reward 'judge' returned nan for example 2 (prompt: 'q1')"),
        ("none", "reward_invalid", "reward 'judge' returned NoneType; a batched reward must return a list"),
        ("too_few", "reward_invalid", "reward 'judge' returned 1 values for 2 completions"),
        ("sandbox", "sandbox_error", "the sandbox process exited with status 1 before running the code"),
    ],
)
def test_the_failed_group_is_dropped_and_the_others_scored_after_one_retry_each(how, kind, said):
    reward = Flaky(how)
    out = _score(reward)
    assert out.total == [1.0, 0.0, None, None, 1.0, 0.0]  # the failed group has no value, never 0
    assert out.components == {"judge": [1.0, 0.0, None, None, 1.0, 0.0]}
    assert [f and f.kind for f in out.failures] == [None, None, kind, kind, None, None]
    assert said in out.failures[2].message and "\n" not in out.failures[2].message
    # the batch, then each group alone (q1's retry failed too)
    assert reward.calls == [["q0", "q0", "q1", "q1", "q2", "q2"], ["q0", "q0"], ["q1", "q1"], ["q2", "q2"]]
    assert out.retries == 3


def test_a_call_that_runs_past_the_timeout_fails_as_reward_timeout():
    reward = Flaky("hang")
    t0 = time.monotonic()
    out = _score(reward, timeout_s=0.3)
    assert time.monotonic() - t0 < 4  # the batch's 0.3 s and q1's own, never the 5 s it sleeps
    assert [f and f.kind for f in out.failures] == [None, None, "reward_timeout", "reward_timeout", None, None]
    assert "reward 'judge' took longer than 0.3 s" in out.failures[2].message
    assert out.total == [1.0, 0.0, None, None, 1.0, 0.0]


def test_a_failure_that_passes_is_absorbed_by_the_retry():
    reward = Flaky("raise", first_call_only=True)
    out = _score(reward)
    assert out.total == [1.0, 0.0] * 3 and out.failures is None and out.retries == 3


def test_without_retries_every_group_of_the_failed_call_is_dropped():
    reward = Flaky("raise")
    out = _score(reward, max_retries=0)
    assert out.total == [None] * 6 and [f.kind for f in out.failures] == ["reward_error"] * 6
    assert len(reward.calls) == 1 and out.retries == 0


def test_every_group_gets_its_retry_even_when_the_reward_fails_everywhere():
    """Giving up early would drop groups never tried alone (and could stop a run under its limit on other ranks)."""
    reward = Flaky("raise", bad="*")
    out = _score(reward, max_retries=2)
    assert out.total == [None] * 6 and len(reward.calls) == 1 + 3 * 2 and out.retries == 6


def test_groups_the_sampler_failed_are_not_scored():
    engine = Failure("engine_error", "the vLLM server answered /v1/completions with 500")
    reward = Flaky("raise", bad="nobody")
    out = _score(reward, failed=[None, None, engine, None, None, None])
    assert reward.calls == [["q0", "q0", "q2", "q2"]]  # q1's rows never reach the reward
    assert out.total == [1.0, 0.0, None, None, 1.0, 0.0] and out.failures[2:4] == [engine, engine]
    assert out.failures[:2] == [None, None] and out.retries == 0


def test_a_per_sample_reward_names_the_exact_example_of_a_group_scored_alone():
    def strict(completion, example):
        if example.prompt == "q2":
            raise KeyError("answer")
        return float(completion.text == example.answer)

    out = score_groups([WeightedReward(per_sample(strict))], COMPLETIONS, EXAMPLES, group_size=G, timeout_s=None)
    assert out.total == [1.0, 0.0, 1.0, 0.0, None, None]
    assert "reward 'strict' raised KeyError on example 4 (prompt: 'q2')" in out.failures[4].message
