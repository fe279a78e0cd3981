"""Environments that break the contract or hang: one line naming the environment and what to return (a failed
episode during a rollout, docs/training.md); lone surrogates in tool or environment text are replaced, not a
traceback; an async tool that blocks its event loop is cut at its timeout; a step that blocks its loop fails
every episode in it at env.step_timeout_s."""

from __future__ import annotations

import asyncio
import math
import re
import time

import pytest
import torch

from grpolab.envs import EnvStep, Tool, ToolLimits, run_tool
from grpolab.envs.contract import EnvError, checked_reset, checked_step
from grpolab.envs.tools import ToolEnv
from grpolab.rollout.base import Sampler
from grpolab.rollout.multiturn import MultiTurnSampler, episode_prompt_ids
from grpolab.tasks.tiny import CHAT_TEMPLATE, build_char_tokenizer
from grpolab.types import Completions, Example

EXAMPLE = Example("q", "1")
LONE = "ok \udcff\ud800 end"


class Env:
    tools: list = []

    def __init__(self, step_value=None, reset_value=None):
        self.step_value, self.reset_value = step_value, reset_value

    def reset(self, example):
        return self.reset_value if self.reset_value is not None else [{"role": "user", "content": example.prompt}]

    def step(self, model_turn):
        return self.step_value


NAME = f"{__name__}.Env"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"reward": 1.0, "done": True}, r"step\(model_turn\) returned dict \{'reward': 1.0.*return grpolab.envs.EnvStep\("),
        (None, r"step\(model_turn\) returned NoneType None; return grpolab.envs.EnvStep\("),
        (EnvStep(reward="1.0", done=True), r"returned reward str '1.0'; the reward must be None .* or a finite number"),
        (EnvStep(reward=math.nan, done=True), r"returned reward float nan; the reward must be None"),
        (EnvStep(reward=True, done=True), r"returned reward bool True"),
        (EnvStep(messages="feedback"), r"step\(model_turn\) returned str 'feedback'"),
        (EnvStep(messages=[{"role": "user", "content": 3}]), r"a message dict .*needs a 'role' string and a 'content'"),
    ],
)
def test_a_step_that_breaks_the_contract_is_one_error_naming_the_env(value, message):
    with pytest.raises(EnvError, match=rf"^environment {NAME}: .*{message}"):
        checked_step(Env(), value)


def test_a_good_step_passes_with_its_numbers_and_cleaned_text():
    step = checked_step(Env(), EnvStep([{"role": "tool", "content": LONE}], reward=2, done=False, tool_calls=1))
    assert step == EnvStep([{"role": "tool", "content": "ok \ufffd\ufffd end"}], 2, False, 1, 0)
    step.messages[0]["content"].encode("utf-8")  # writable and tokenizable


def test_a_reset_returning_a_string_is_refused_before_training():
    tok = build_char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    with pytest.raises(EnvError, match=rf"environment {NAME}: reset\(example\) returned str 'q'; return the first chat"):
        episode_prompt_ids([EXAMPLE], tok, lambda: Env(reset_value="q"))
    assert checked_reset(Env(), [{"role": "user", "content": LONE}]) == [{"role": "user", "content": "ok \ufffd\ufffd end"}]


class OneTurn(Sampler):
    """An inner sampler: the turn ``text`` for every context (e.g. a tool call)."""

    def __init__(self, tok, text="1"):
        self.tok, self.text, self.pad_token_id = tok, text, tok.pad_token_id

    def sample(self, prompt_ids, *, num_generations, generator=None, examples=None):
        turn = self.tok(self.text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        ids = torch.tensor([turn] * len(prompt_ids))
        mask = torch.ones_like(ids, dtype=torch.bool)
        return Completions([list(p) for p in prompt_ids], ids, mask, -mask.float(), ["x"] * len(ids), ["stop"] * len(ids), 1)


def _sample(make_env, timeout_s=5.0, text="1"):
    tok = build_char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    sampler = MultiTurnSampler(OneTurn(tok, text), tok, make_env, max_turns=2, max_episode_tokens=64, step_timeout_s=timeout_s)
    return sampler.sample(episode_prompt_ids([EXAMPLE], tok, make_env), num_generations=2, examples=[EXAMPLE])


def test_a_step_that_breaks_the_contract_fails_its_episode_with_the_envs_name_not_a_traceback():
    stepped = []

    class Stepped(Env):
        def step(self, model_turn):
            stepped.append(self)
            return super().step(model_turn)

    out = _sample(lambda: Stepped(step_value={"done": True}))
    assert [f.kind for f in out.failures] == ["env_error"] * 2
    assert all(re.match(rf"environment {__name__}\..*Stepped: step\(model_turn\) returned dict", f.message) for f in out.failures)
    # each episode was run again once (env.max_retries=1), from a fresh environment: 2 x 2 of them stepped
    assert [e.retries for e in out.episodes] == [1, 1] and len({id(e) for e in stepped}) == len(stepped) == 4


class BlocksItsLoop(Env):
    async def step(self, model_turn):
        time.sleep(10)  # blocks the event loop: asyncio.wait_for could never fire
        return EnvStep(done=True)


def test_a_step_that_blocks_its_loop_fails_every_running_episode_at_step_timeout_s():
    t0 = time.monotonic()
    out = _sample(BlocksItsLoop, timeout_s=0.5)
    assert time.monotonic() - t0 < 8  # 0.5 s + the loop's grace, never the 10 s it blocks for
    assert [f.kind for f in out.failures] == ["env_timeout"] * 2
    assert re.search(r"step\(model_turn\) of .*BlocksItsLoop did not return within env.step_timeout_s=0.5 s", out.failures[0].message)
    assert [e.retries for e in out.episodes] == [0, 0]  # the loop is stuck: nothing could run again in it


def test_an_async_tool_that_blocks_its_event_loop_is_cut_at_the_timeout():
    async def stuck(x: str) -> str:
        """Blocks.

        Args:
            x: anything.
        """
        time.sleep(3)
        return "late"

    async def main():
        t0 = time.monotonic()
        result = await run_tool(Tool.from_function(stuck), {"x": "1"}, ToolLimits(timeout_s=0.3))
        return result, time.monotonic() - t0

    result, elapsed = asyncio.run(main())
    assert result.error == "timeout" and elapsed < 1.5


def test_tool_output_with_lone_surrogates_reaches_the_model_replaced():
    def emits(x: str) -> str:
        """Emits bad text.

        Args:
            x: anything.
        """
        return LONE

    env = ToolEnv([Tool.from_function(emits)], call_format="python")
    env.reset(EXAMPLE)
    step = asyncio.run(env.step("emits(1)"))
    assert checked_step(env, step).messages[0]["content"] == "ok \ufffd\ufffd end"
    out = _sample(lambda: ToolEnv([Tool.from_function(emits)], call_format="python"), text="emits(1)")
    assert all(e.messages[2]["content"] == "ok \ufffd\ufffd end" for e in out.episodes)


class NoStep:
    tools: list = []

    def reset(self, example):
        return []


def test_an_env_name_that_makes_no_environment_is_a_config_error(monkeypatch):
    from grpolab.config import ConfigError
    from grpolab.envs import build_environment

    with pytest.raises(ConfigError, match=r"env.name='test_contract:NoStep' made a NoStep with no step method"):
        build_environment(f"{__name__}:NoStep", {}, ToolLimits())
    with pytest.raises(ConfigError, match=r"made a str with no reset or step method"):
        build_environment("builtins:str", {}, ToolLimits())
