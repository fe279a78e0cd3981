"""Failed episodes (docs/training.md, "Failed samples"): an environment that raises (a ConnectionResetError from a
remote service that is gone), hangs, cannot be made or reset, a sandbox that dies under a tool, or an engine that
fails a model turn: the episode runs again from a fresh environment (env.max_retries), then fails with its kind,
never a traceback and never a reward."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from grpolab.envs import EnvStep, Tool
from grpolab.envs.tools import ToolEnv
from grpolab.rollout.base import SampleFailed, Sampler, without_failures
from grpolab.rollout.multiturn import MultiTurnSampler, episode_prompt_ids
from grpolab.sandbox.runner import SandboxError
from grpolab.tasks.tiny import CHAT_TEMPLATE, build_char_tokenizer
from grpolab.types import Completions, Example, Failure

EXAMPLES = [Example("a", "1"), Example("b", "1")]


class Remote:
    """An async environment over a remote service: one turn, reward 1. ``broken`` (shared by every instance) says
    which instances' steps raise ConnectionResetError, by creation number; ``resets`` which resets raise."""

    tools: list = []
    made = 0

    def __init__(self, broken=(), resets=(), hang=False):
        type(self).made += 1
        self.number, self.broken, self.resets, self.hang = type(self).made, broken, resets, hang

    def reset(self, example):
        if self.number in self.resets:
            raise ConnectionResetError("reset: connection reset by peer")
        return [{"role": "user", "content": example.prompt}]

    async def step(self, model_turn):
        if self.hang:
            await asyncio.sleep(60)  # awaits forever: cut at the step timeout
        if self.number in self.broken:
            raise ConnectionResetError("[Errno 104] Connection reset by peer")
        return EnvStep(reward=1.0, done=True)


class OneTurn(Sampler):
    """An inner sampler: the turn "1" + EOS for every context; rows in ``failed`` (by call and row) fail."""

    def __init__(self, tok, failed=()):
        self.tok, self.pad_token_id, self.failed, self.calls = tok, tok.pad_token_id, set(failed), 0

    def sample(self, prompt_ids, *, num_generations, generator=None):
        self.calls += 1
        turn = self.tok("1", add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        ids = torch.tensor([turn] * len(prompt_ids))
        mask = torch.ones_like(ids, dtype=torch.bool)
        out = Completions([list(p) for p in prompt_ids], ids, mask, -mask.float(), ["1"] * len(ids), ["stop"] * len(ids), 1)
        bad = [Failure("engine_error", "the vLLM server answered with 500") if (self.calls, i) in self.failed else None
               for i in range(len(ids))]  # fmt: skip
        out.failures = bad if any(bad) else None
        return out


@pytest.fixture
def tok():
    tok = build_char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _sample(tok, make_env, inner=None, **kwargs):
    """Two prompts x G=2 episodes; the prompts rendered first (environments numbered 1.. after that)."""
    prompts = episode_prompt_ids(EXAMPLES, tok, Remote)
    sampler = MultiTurnSampler(inner or OneTurn(tok), tok, Remote, max_turns=2, max_episode_tokens=64, **kwargs)
    Remote.made = 0
    sampler.make_env = make_env
    return sampler.sample(prompts, num_generations=2, examples=EXAMPLES)


def test_a_step_that_loses_its_connection_is_run_again_from_a_fresh_environment(tok):
    out = _sample(tok, lambda: Remote(broken={2}))  # the 2nd environment made (prompt a, episode 2) breaks once
    assert out.failures is None
    assert [e.retries for e in out.episodes] == [0, 1, 0, 0]
    assert [e.env_reward for e in out.episodes] == [1.0] * 4 and Remote.made == 5
    assert torch.equal(out.completion_ids[1], out.completion_ids[0])  # the rerun episode is whole, not spliced


def test_an_episode_whose_retries_fail_too_is_failed_never_scored(tok):
    out = _sample(tok, lambda: Remote(broken={2, 5, 6}), max_retries=2)  # episode 2 and its two reruns
    assert [f and f.kind for f in out.failures] == [None, "env_error", None, None]
    assert out.failures[1].message == (
        "environment test_multiturn_failures.Remote: step(model_turn) raised ConnectionResetError: "
        "[Errno 104] Connection reset by peer"
    )
    assert out.episodes[1].retries == 2 and out.episodes[1].env_reward is None


def test_a_reset_or_a_factory_that_raises_fails_the_attempt_only(tok):
    out = _sample(tok, lambda: Remote(resets={1}))
    assert out.failures is None and out.episodes[0].retries == 1

    def factory():
        raise OSError("no route to the environment service")

    out = _sample(tok, factory, max_retries=0)
    assert [f.kind for f in out.failures] == ["env_error"] * 4
    assert out.failures[0].message == "making an environment (env.name) raised OSError: no route to the environment service"


def test_a_step_that_awaits_forever_is_cut_at_the_step_timeout_each_attempt(tok):
    t0 = time.monotonic()
    out = _sample(tok, lambda: Remote(hang=True), step_timeout_s=0.3)
    assert 0.6 <= time.monotonic() - t0 < 10  # two attempts of 0.3 s (env.max_retries=1), not 60 s
    assert [f.kind for f in out.failures] == ["env_timeout"] * 4
    assert "step(model_turn) did not return within env.step_timeout_s=0.3 s" in out.failures[0].message
    assert [e.retries for e in out.episodes] == [1] * 4


def test_a_sandbox_that_dies_under_a_tool_fails_the_episode_as_sandbox_error(tok):
    def run(code: str) -> str:
        """Runs code.

        Args:
            code: the program.
        """
        raise SandboxError("the sandbox process exited with status 1 before running the code")

    env = lambda: ToolEnv([Tool.from_function(run)], call_format="python")  # noqa: E731
    out = _sample(tok, env, inner=_Calls(tok), max_retries=0)
    assert [f.kind for f in out.failures] == ["sandbox_error"] * 4
    assert "raised SandboxError: the sandbox process exited with status 1" in out.failures[0].message


class _Calls(OneTurn):
    """The turn ``run(1)``: a tool call."""

    def sample(self, prompt_ids, *, num_generations, generator=None):
        turn = self.tok("run(1)", add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        ids = torch.tensor([turn] * len(prompt_ids))
        mask = torch.ones_like(ids, dtype=torch.bool)
        return Completions([list(p) for p in prompt_ids], ids, mask, -mask.float(), ["x"] * len(ids), ["stop"] * len(ids), 1)


def test_an_engine_failure_in_a_model_turn_reruns_the_episode_then_fails_it(tok):
    out = _sample(tok, Remote, inner=OneTurn(tok, failed={(1, 3)}))  # episode 4's first model turn
    assert out.failures is None and [e.retries for e in out.episodes] == [0, 0, 0, 1]
    out = _sample(tok, Remote, inner=OneTurn(tok, failed={(1, 3), (2, 0)}))  # and its rerun's
    assert [f and f.kind for f in out.failures] == [None, None, None, "engine_error"]
    with pytest.raises(SampleFailed, match=r"^eval: a sample failed \(engine_error\): the vLLM server answered with 500$"):
        without_failures(out, "eval")  # where a group cannot be dropped, a failure stops
