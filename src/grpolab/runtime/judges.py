"""The run's judges (rewards/judge): each one that grpolab serves itself gets a vLLM server of its own on loopback,
started before the rewards' dry run and stopped when the run ends (docs/rewards.md, "Judges").

The server is server mode's (rollout/vllm/server.py: a guard that stops the whole process group when the trainer
dies, a record that reclaims what a killed one left, /health polled until it answers, every failure one line),
started from the judge's own model path: a judge never shares weights with the policy, and a judge's ``base_url``
that is the policy's server (rollout.server_url) is refused.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from urllib.parse import urlsplit

import torch

from grpolab.config import Config, ConfigError
from grpolab.models.sources import local_source
from grpolab.rewards import WeightedReward
from grpolab.rewards.judge import JudgeReward, ServeSettings
from grpolab.rollout.vllm.server import VLLMServer

log = logging.getLogger(__name__)

SERVED_NAME = "judge"
"""The model name the judge's server answers to (JudgeSettings.model_name's default)."""


def judges(rewards: Sequence[WeightedReward]) -> list[JudgeReward]:
    """The judge rewards among ``rewards`` (an alias forwards to the reward it renames)."""
    found = []
    for weighted in rewards:
        reward = weighted.reward
        while not isinstance(reward, JudgeReward) and hasattr(reward, "reward"):
            reward = reward.reward
        if isinstance(reward, JudgeReward):
            found.append(reward)
    return found


def _same_server(a: str, b: str) -> bool:
    x, y = urlsplit(a), urlsplit(b)
    return (x.hostname, x.port) == (y.hostname, y.port)


def start_judge_server(serve: ServeSettings) -> VLLMServer:
    """A healthy vLLM server of ``serve.model`` on a free loopback port, or one RolloutServerError line."""
    source = local_source(serve.model)  # a GGUF file or package: path: its converted folder
    args = ["--model", source, "--served-model-name", SERVED_NAME, "--max-model-len", str(serve.max_model_len),
            "--dtype", serve.dtype, "--seed", "0", "--kv-cache-memory-bytes", str(serve.kv_cache_gib * 2**30)]  # fmt: skip
    if not torch.cuda.is_available():
        args.append("--enforce-eager")  # no graphs to capture on a CPU
    if serve.chat_template is not None:
        args += ["--chat-template", serve.chat_template]
    if serve.max_num_seqs is not None:
        args += ["--max-num-seqs", str(serve.max_num_seqs)]
    env = {"VLLM_CPU_KVCACHE_SPACE": str(serve.kv_cache_gib),
           "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}  # fmt: skip
    server = VLLMServer.start(args, host="127.0.0.1", env=env)
    server.wait_healthy(serve.start_timeout_s)
    log.info("judge server for %s ready at %s (log: %s)", serve.model, server.url, server.log_path)
    return server


def prepare_judges(cfg: Config, rewards: Sequence[WeightedReward]) -> None:
    """Tell each group judge G (rollout.num_generations), refuse a judge at the policy's server, and start the
    server of each judge that has ``serve`` (stopped by ``close_judges``; by its guard if the run dies)."""
    for judge in judges(rewards):
        if judge.group:
            judge.group_size = cfg.rollout.num_generations
        url = judge.settings.base_url
        if url and cfg.rollout.server_url and _same_server(url, cfg.rollout.server_url):
            raise ConfigError(
                f"reward '{judge.name}': base_url {url} is the policy's server (rollout.server_url): a judge never "
                "shares weights with the policy; serve the judge on a server of its own (serve: {model: ...})"
            )
        if judge.settings.serve is not None and judge.server is None:
            judge.attach_server(start_judge_server(judge.settings.serve))


def close_judges(rewards: Sequence[WeightedReward]) -> None:
    """Stop every judge server the run started."""
    for judge in judges(rewards):
        judge.close()


@contextlib.contextmanager
def judges_served(cfg: Config, rewards: Sequence[WeightedReward]) -> Iterator[None]:
    """``prepare_judges`` for the block, ``close_judges`` after it (an error on the way out included)."""
    try:
        prepare_judges(cfg, rewards)
        yield
    finally:
        close_judges(rewards)
