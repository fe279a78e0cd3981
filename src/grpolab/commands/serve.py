"""``grpolab serve``: the vLLM server of a config's rollout.mode=server settings, for trainers that reach it by
rollout.server_url, until Ctrl-C (docs/server_mode.md). The config is read here into the engine's spec
(runtime/engine_spec.py); rollout/vllm/server_setup.py starts and stops the server from it."""

from __future__ import annotations

from grpolab.config import Config
from grpolab.rollout.vllm.server_setup import serve as serve_spec
from grpolab.runtime.engine_spec import engine_spec


def serve(cfg: Config) -> int:
    """The server of ``cfg`` until SIGINT / SIGTERM / SIGHUP (``server_setup.serve``); the exit status."""
    return serve_spec(engine_spec(cfg))
