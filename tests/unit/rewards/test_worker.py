"""reward.timeout_s holds whatever a user reward does: it runs in a worker process, killed at the deadline.

A reward that swallows the timeout (a bare ``except:``) or stays in C code (a catastrophic regex,
which holds the GIL) is cut off at timeout_s with the contract's message; the worker is started again
for the next call, so the process goes on. Exceptions keep their type, message and example.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path

import pytest

from grpolab.rewards import (
    IN_PROCESS,
    RewardError,
    SampleError,
    WeightedReward,
    build_reward,
    dry_run,
    per_sample,
    score_batch,
    start_workers,
)
from grpolab.rewards.worker import isolated, worker_for
from grpolab.types import Completion, Example

TIMEOUT_S = 0.5
SLACK_S = 1.0  # fork, kill and reap, on a loaded machine


def batch(*texts: str) -> tuple[list[Completion], list[Example]]:
    return [Completion(t, 1) for t in texts], [Example(f"question {i}") for i in range(len(texts))]


def swallows_the_timeout(completion, example):
    if completion.text != "hang":
        return 1.0
    while True:
        try:  # noqa: SIM105
            time.sleep(10)
        except:  # noqa: E722 (the point: a bare except that eats whatever interrupts it)
            pass


def catastrophic_regex(completion, example):
    if completion.text != "hang":
        return 1.0
    return float(bool(re.match(r"(a+)+$", "a" * 40 + "b")))  # in C, holding the GIL, for minutes


@pytest.mark.parametrize("fn", [swallows_the_timeout, catastrophic_regex])
def test_the_timeout_holds_and_the_run_goes_on(fn):
    reward = WeightedReward(per_sample(fn))
    message = rf"reward '{fn.__name__}' took longer than 0.5 s on a batch of 2 completions \(first example 0 "
    start = time.monotonic()
    with pytest.raises(RewardError, match=message + r".*raise reward.timeout_s or make it faster"):
        score_batch([reward], *batch("hang", "ok"), timeout_s=TIMEOUT_S)
    assert TIMEOUT_S <= time.monotonic() - start < TIMEOUT_S + SLACK_S
    assert worker_for(reward.reward).pid is None  # killed, and reaped
    start = time.monotonic()
    assert score_batch([reward], *batch("ok", "ok"), timeout_s=TIMEOUT_S).total == [1.0, 1.0]  # a new worker
    assert time.monotonic() - start < TIMEOUT_S


def test_a_lambda_with_state_runs_in_its_worker_and_keeps_its_state_there():
    calls = []

    def counting(completion, example):
        calls.append(1)
        return float(len(calls))

    reward = per_sample(counting)
    assert score_batch([WeightedReward(reward)], *batch("a", "b"), timeout_s=5.0).total == [1.0, 2.0]
    assert score_batch([WeightedReward(reward)], *batch("c"), timeout_s=5.0).total == [3.0]  # the same worker
    assert calls == []  # what the reward changed stayed in the worker
    pid = worker_for(reward).pid
    assert pid is not None and pid != os.getpid()
    del reward
    import gc

    gc.collect()
    with pytest.raises(ChildProcessError):  # the reward is gone: its worker was killed and reaped
        os.waitpid(pid, os.WNOHANG)


def exits_hard(completion, example):
    os._exit(7)


def test_a_reward_that_ends_its_worker_is_an_error_naming_it():
    with pytest.raises(RewardError, match=r"reward 'exits_hard' ended its worker process \(exit status 7\) on a batch"):
        score_batch([WeightedReward(per_sample(exits_hard))], *batch("a"), timeout_s=5.0)


class LocalError(Exception):
    def __init__(self, a, b):  # pickle cannot rebuild it: sent back by type name and message
        super().__init__(f"{a} and {b}")


def test_exceptions_keep_their_type_message_and_example():
    def boom(completion, example):
        if completion.text == "c":
            raise KeyError("needs field 'x'")
        return 0.0

    with pytest.raises(SampleError, match=r"reward 'boom' raised KeyError on example 2 \(prompt: 'question 2'\)") as info:
        score_batch([WeightedReward(per_sample(boom))], *batch("a", "b", "c"), timeout_s=5.0)
    assert isinstance(info.value.exc, KeyError)
    assert any("worker process" in note for note in info.value.__notes__)  # its traceback, for debugging

    def unpicklable(completion, example):
        raise LocalError(1, 2)

    with pytest.raises(SampleError, match=r"raised LocalError on example 0 \(prompt: 'question 0'\): 1 and 2"):
        score_batch([WeightedReward(per_sample(unpicklable))], *batch("a"), timeout_s=5.0)

    class Batched:
        name = "batched"

        def __call__(self, completions, examples):
            raise ZeroDivisionError("oops")

    with pytest.raises(RewardError, match=r"reward 'batched' raised ZeroDivisionError on a batch of 2") as info:
        score_batch([WeightedReward(Batched())], *batch("a", "b"), timeout_s=5.0)
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_exit_and_unsendable_values_are_named():
    def leaves(completion, example):
        raise SystemExit(3)

    with pytest.raises(RewardError, match=r"reward 'leaves' called sys.exit\(3\)"):
        score_batch([WeightedReward(per_sample(leaves))], *batch("a"), timeout_s=5.0)

    class Generator:
        name = "generator"

        def __call__(self, completions, examples):
            return (1.0 for _ in completions)

    with pytest.raises(RewardError, match=r"reward 'generator' returned generator, which cannot be sent back"):
        score_batch([WeightedReward(Generator())], *batch("a"), timeout_s=5.0)


def test_the_dry_run_names_the_slow_example():
    with pytest.raises(RewardError, match=r"took longer than 0.5 s on a batch of 1 .*example 1 \(prompt: 'question 1'\)"):
        dry_run([WeightedReward(per_sample(catastrophic_regex))], *batch("ok", "hang", "ok"), timeout_s=TIMEOUT_S)


class AsyncHang:
    name = "async_hang"
    is_async = True

    def __call__(self, completions, examples):
        return asyncio.run(self.acall(completions, examples))

    async def acall(self, completions, examples):
        if any(c.text == "hang" for c in completions):
            re.match(r"(a+)+$", "a" * 40 + "b")
        return [0.5] * len(completions)


class AsyncOk(AsyncHang):
    name = "async_ok"


def test_async_rewards_are_cut_off_too():
    rewards = [WeightedReward(AsyncOk()), WeightedReward(AsyncHang())]
    start = time.monotonic()
    with pytest.raises(RewardError, match=r"reward 'async_ok'\+'async_hang' \(async, awaited together\) took longer"):
        score_batch(rewards, *batch("hang"), timeout_s=TIMEOUT_S)
    assert time.monotonic() - start < TIMEOUT_S + SLACK_S
    assert score_batch(rewards, *batch("ok", "ok"), timeout_s=TIMEOUT_S).total == [1.0, 1.0]


def test_what_runs_where():
    assert isolated(per_sample(swallows_the_timeout), 1.0)
    assert not isolated(per_sample(swallows_the_timeout), None)  # no timeout: called directly
    judge = {"base_url": "http://127.0.0.1:9/v1", "model": "m"}  # built, never called
    kwargs = {"soft_overlong": {"max_length": 8, "cache_length": 4}, "length_penalty": {"coef": 0.1, "max_length": 8},
              "judge": {**judge, "template": "Grade: {completion}"},
              "group_judge": {**judge, "template": "Rank: {completions}"}}  # fmt: skip
    for name in sorted(IN_PROCESS - {"reward_model"}):  # (a model folder is needed for that one)
        assert not isolated(build_reward(name, kwargs=kwargs.get(name)).reward, 1.0), name
    assert isolated(build_reward("math_accuracy").reward, 1.0)  # a third-party parser of the completion
    assert isolated(build_reward("math_accuracy", alias="acc").reward, 1.0)
    assert not isolated(build_reward("exact_match", alias="em").reward, 1.0)


def test_overhead_per_call_is_small():
    """1000 calls of a trivial reward through its worker (the figure, in-process vs worker, is in the docs)."""
    reward = WeightedReward(per_sample(lambda c, e: 1.0, name="trivial"))
    completions, examples = batch(*(["x" * 100] * 8))
    score_batch([reward], completions, examples, timeout_s=5.0)  # the worker starts
    start = time.perf_counter()
    for _ in range(200):
        score_batch([reward], completions, examples, timeout_s=5.0)
    per_call_s = (time.perf_counter() - start) / 200
    assert per_call_s < 0.02  # about 0.2 ms alone on this machine; 100x that under heavy contention


def test_workers_can_be_started_before_the_first_call():
    """So that a run without a dry run forks them before its model loads (docs/code_reward.md)."""
    sync, asynchronous = WeightedReward(per_sample(lambda c, e: 1.0, name="sync")), WeightedReward(AsyncOk())
    start_workers([sync, asynchronous, build_reward("exact_match")], timeout_s=5.0)
    pid = worker_for(sync.reward).pid
    assert pid is not None
    assert score_batch([sync, asynchronous], *batch("a"), timeout_s=5.0).total == [1.5]
    assert worker_for(sync.reward).pid == pid  # the call went to the worker started above


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie (no reaper in some containers) runs nothing


def test_what_a_reward_started_dies_with_its_worker(tmp_path):
    """A user code reward that runs a compiler or a test binary with subprocess, and hangs on it."""
    marker = tmp_path / "child.pid"

    def spawns_and_hangs(completion, example):
        import subprocess

        child = subprocess.Popen(["sleep", "60"])
        marker.write_text(str(child.pid))
        child.wait()
        return 1.0

    with pytest.raises(RewardError, match="took longer than 0.5 s"):
        score_batch([WeightedReward(per_sample(spawns_and_hangs))], *batch("a"), timeout_s=TIMEOUT_S)
    pid = int(marker.read_text())
    end = time.monotonic() + 5
    while _running(pid) and time.monotonic() < end:
        time.sleep(0.05)
    assert not _running(pid)


def garbles_its_channel(completion, example):
    """Writes a header announcing a huge reply on every socket it has, then never sends it."""
    import stat

    for fd in range(3, 256):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.write(fd, b"\x7f" * 8 + b"partial")
        except OSError:
            pass
    while True:
        time.sleep(1)


def test_the_timeout_holds_when_the_reward_writes_on_its_channel():
    start = time.monotonic()
    with pytest.raises(RewardError, match="took longer than 0.5 s"):
        score_batch([WeightedReward(per_sample(garbles_its_channel))], *batch("a"), timeout_s=TIMEOUT_S)
    assert time.monotonic() - start < TIMEOUT_S + SLACK_S
