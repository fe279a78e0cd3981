"""OpenEnv (``openenv-core``) environments as grpolab Environments: one server session per episode.

An OpenEnv environment is a server (FastAPI; ``openenv.core.env_server.create_app``) that clients reach
over a WebSocket session: ``reset()`` and ``step(action)`` return ``StepResult(observation, reward,
done)``, the observation a dict. The adapter uses openenv's own ``GenericEnvClient`` (dict actions and
observations, no environment package needed):

* ``reset(example)`` returns the example's messages (the prompt is the dataset's, tokenized before
  training); the server session is opened and reset at the episode's first step, with
  ``example.meta["seed"]`` when there is one.
* ``step(model_turn)`` sends ``{action_field: model_turn}``; the observation's ``observation_field``
  (the whole observation as JSON when it has no such field) goes back as a ``role`` message, cut to
  ``max_chars``; the reward and done are the server's.
* A server that fails (its WebSocket closes: it exited mid-episode) raises ConnectionError, and one that
  answers past ``timeout_s`` TimeoutError, after the session is dropped: the episode fails, and is run
  again on a fresh session or its group is dropped (docs/training.md, "Failed samples"). It is never scored
  0: a server's failure says nothing of the policy.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from grpolab.envs.base import EnvStep, Message
from grpolab.types import Example

log = logging.getLogger(__name__)


class OpenEnvAdapter:
    """Implements ``grpolab.envs.Environment`` over an OpenEnv server at ``base_url``."""

    tools: list = []

    def __init__(
        self,
        base_url: str,
        *,
        action_field: str = "message",
        observation_field: str = "message",
        role: str = "user",
        timeout_s: float = 30.0,
        max_chars: int = 2000,
    ) -> None:
        self.base_url = base_url
        self.action_field = action_field
        self.observation_field = observation_field
        self.role = role
        self.timeout_s = timeout_s
        self.max_chars = max_chars
        self.client: Any = None
        self.example: Example | None = None

    def reset(self, example: Example) -> list[Message]:
        self.example = example
        if example.messages is not None:
            return [dict(m) for m in example.messages]
        return [{"role": "user", "content": example.prompt}]

    async def step(self, model_turn: str) -> EnvStep:
        try:
            return await asyncio.wait_for(self._step(model_turn), self.timeout_s)
        except TimeoutError:
            await self._drop_client()
            raise TimeoutError(f"OpenEnv server {self.base_url} did not answer within {self.timeout_s:g} s") from None
        except Exception as exc:  # whatever the client raises (websockets' ConnectionClosed when the server exits
            # mid-episode, a bad JSON answer) is the server's failure: one error type, the session dropped first
            await self._drop_client()
            raise ConnectionError(f"OpenEnv server {self.base_url} failed ({type(exc).__name__}: {exc})") from exc

    async def _step(self, model_turn: str) -> EnvStep:
        if self.client is None:
            from openenv.core.generic_client import (
                GenericEnvClient,  # optional: pip install 'grpolab[openenv]'
            )

            self.client = GenericEnvClient(base_url=self.base_url, message_timeout_s=self.timeout_s)
            seed = (self.example.meta or {}).get("seed") if self.example is not None else None
            await self.client.reset(**({"seed": seed} if seed is not None else {}))
        result = await self.client.step({self.action_field: model_turn})
        observation = result.observation or {}
        text = observation.get(self.observation_field)
        text = json.dumps(observation, default=str) if text is None else str(text)
        if len(text) > self.max_chars:
            text = text[: self.max_chars]
        reward = None if result.reward is None else float(result.reward)
        return EnvStep([{"role": self.role, "content": text}], reward=reward, done=bool(result.done))

    async def close(self) -> None:
        await self._drop_client()

    async def _drop_client(self) -> None:
        """Close the session; a server already gone fails to close, which changes nothing (logged at DEBUG)."""
        if self.client is not None:
            client, self.client = self.client, None
            try:
                await asyncio.wait_for(client.close(), self.timeout_s)
            except Exception as exc:  # noqa: BLE001
                log.debug("closing the OpenEnv session with %s failed: %s", self.base_url, exc)
