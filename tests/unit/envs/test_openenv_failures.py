"""An OpenEnv server that exits in the middle of an episode: the step raises ConnectionError naming the server
(the episode fails: run again or its group dropped, never scored 0; docs/training.md), and closing the dead
session changes nothing."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

pytest.importorskip("openenv.core", reason="openenv-core is optional: pip install 'grpolab[openenv]'")

from openenv.core.env_server.http_server import create_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402

from grpolab.envs import ToolLimits, build_environment  # noqa: E402
from grpolab.types import Example  # noqa: E402


class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    message: str = ""


class Echo(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id="e", step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        return EchoObservation(message="go")

    def step(self, action, timeout_s=None, **kwargs):
        return EchoObservation(message=action.message, reward=0.5)

    @property
    def state(self):
        return self._state


def _serve():
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(Echo, EchoAction, EchoObservation, max_concurrent_envs=2)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    return server, thread, f"http://127.0.0.1:{port}"


def test_a_server_that_exits_mid_episode_fails_the_step_not_a_zero_reward():
    server, thread, url = _serve()
    env = build_environment("openenv", {"base_url": url}, ToolLimits(timeout_s=5))()
    env.reset(Example("x"))

    async def episode():
        first = await env.step("hello")
        server.should_exit = True  # the server goes away with the session open
        await asyncio.get_running_loop().run_in_executor(None, thread.join, 10)
        try:
            await env.step("again")
        except ConnectionError as err:
            second = err
        await env.close()
        return first, second

    first, second = asyncio.run(episode())
    assert (first.reward, first.done, first.messages[0]["content"]) == (0.5, False, "hello")
    assert isinstance(second, ConnectionError) and str(second).startswith(f"OpenEnv server {url} failed (")
    assert env.client is None  # the dead session was dropped: a retry opens a fresh one
