"""The OpenEnv adapter against a real openenv-core server on 127.0.0.1, started by the test."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import torch

pytest.importorskip("openenv.core", reason="openenv-core is optional: pip install 'grpolab[openenv]'")

from openenv.core.env_server.http_server import create_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402

from grpolab.envs import ToolLimits, build_environment  # noqa: E402
from grpolab.rollout.base import Sampler
from grpolab.rollout.multiturn import MultiTurnSampler, episode_prompt_ids  # noqa: E402
from grpolab.tasks.tiny import CHAT_TEMPLATE, build_char_tokenizer  # noqa: E402
from grpolab.types import Completions, Example  # noqa: E402


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    message: str = ""


class Guess(Environment):
    """Guess the number 36: "lower" / "higher" until right (reward 1), 0 per wrong guess."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id="e", step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state = State(episode_id=episode_id or "e", step_count=0)
        return GuessObservation(message="guess")

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        guess = int(action.message) if action.message.strip().isdigit() else -1
        if guess == 36:
            return GuessObservation(message="right", reward=1.0, done=True)
        return GuessObservation(message="lower" if guess > 36 else "higher", reward=0.0)

    @property
    def state(self):
        return self._state


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server_url():
    import uvicorn

    port = free_port()
    app = create_app(Guess, GuessAction, GuessObservation, max_concurrent_envs=8)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "the loopback OpenEnv server did not start"
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


class Guesser(Sampler):
    """An inner sampler: guesses 40 first, then 36 once told "lower"."""

    def __init__(self, tok):
        self.tok, self.pad_token_id = tok, tok.pad_token_id

    def sample(self, prompt_ids, *, num_generations, generator=None, examples=None):
        rows = []
        for ids in prompt_ids:
            text = "36" if "lower" in self.tok.decode(ids) else "40"
            rows.append(self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id])
        ids = torch.tensor(rows)
        mask = torch.ones_like(ids, dtype=torch.bool)
        return Completions([list(p) for p in prompt_ids], ids, mask, -mask.float(), ["?"] * len(rows), ["stop"] * len(rows), 1)


def test_openenv_episodes_over_a_loopback_server(server_url):
    tok = build_char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    make_env = build_environment("openenv", {"base_url": server_url}, ToolLimits(timeout_s=20))
    example = Example("guess the number")
    prompts = episode_prompt_ids([example], tok, make_env)
    sampler = MultiTurnSampler(Guesser(tok), tok, make_env, max_turns=3, max_episode_tokens=80)
    out = sampler.sample(prompts, num_generations=3, examples=[example])
    for ep in out.episodes:
        assert (ep.env_reward, ep.turns, ep.tool_errors) == (1.0, 2, 0)
        assert [m["content"] for m in ep.messages[1:]] == ["40", "lower", "36"]
    assert out.finish_reasons == ["stop"] * 3
    env_text = tok.decode(out.completion_ids[0][~out.sampled_mask[0]])
    assert env_text == " <user>lower <assistant>"  # the server's observation, laid out by the template


def test_a_dead_server_fails_the_step_never_a_zero_reward():
    """The episode then fails (run again, or its group dropped: docs/training.md), not scored 0."""
    url = f"http://127.0.0.1:{free_port()}"
    env = build_environment("openenv", {"base_url": url}, ToolLimits(timeout_s=5))()
    env.reset(Example("x"))
    with pytest.raises(ConnectionError, match=rf"^OpenEnv server {url} failed \(ConnectionError: Failed to connect"):
        asyncio.run(env.step("40"))
