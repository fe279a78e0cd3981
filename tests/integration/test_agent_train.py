"""Multi-turn GRPO through the real paths: the library loop, exact resume, torchrun with 2 ranks, the
agent demo's CLI. A tiny model with a chat template plays the calculator environment."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from grpolab.config import load_config
from grpolab.run.logging import read_metrics
from grpolab.training.loop import train


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory) -> str:
    from grpolab.tasks.tiny import CHAT_TEMPLATE, build_char_tokenizer, build_tiny_model

    path = tmp_path_factory.mktemp("tiny_chat")
    tok = build_char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _overrides(model_dir, out, name, steps) -> list[str]:
    return [
        f"model.name_or_path={model_dir}", "model.autocast=none", "data.source=multiplication", "data.size=40",
        "env.name=calculator", "env.kwargs={call_format: python}", "env.max_turns=3", "env.max_episode_tokens=40",
        "reward.functions=[{name: env}, {name: 'toy_rewards:digit_fraction'}]", "rollout.num_generations=4",
        "rollout.max_completion_length=8", "train.prompts_per_step=2", f"train.num_steps={steps}", "algo.beta=0.04",
        "algo.mu=2", "optim.lr=1e-3", f"log.output_dir={out}", f"log.run_name={name}", "log.checkpoint_every=1",
        "log.progress=false",
    ]  # fmt: skip


def test_env_training_resumes_exactly(chat_model_dir, tmp_path):
    straight = train(load_config(None, _overrides(chat_model_dir, tmp_path, "straight", 3)))
    train(load_config(None, _overrides(chat_model_dir, tmp_path, "resumed", 2)))
    resumed = train(load_config(None, _overrides(chat_model_dir, tmp_path, "resumed", 3)), resume=True)
    a, b = read_metrics(straight.run_dir), read_metrics(resumed.run_dir)
    assert [r["step"] for r in b] == [1, 2, 3]
    for ra, rb in zip(a, b, strict=True):
        assert {k: v for k, v in ra.items() if not k.startswith("sys/")} == {
            k: v for k, v in rb.items() if not k.startswith("sys/")
        }
    assert {"num_turns/mean", "tools/call_frequency", "tools/failure_frequency", "rollout/model_token_frac"} <= set(a[0])
    assert "rewards/env/mean" in a[0]
    assert all(r["kl"] >= 0 and 0 < r["rollout/model_token_frac"] <= 1 for r in a)
    wa = load_file(straight.run_dir / "checkpoints/step_3/model.safetensors")
    wb = load_file(resumed.run_dir / "checkpoints/step_3/model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_two_ranks_with_an_environment(chat_model_dir, tmp_path):
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(free_port()), "-m", "grpolab", "train",
        *_overrides(chat_model_dir, tmp_path, "ddp", 2), "train.parallel=ddp",
    ]  # fmt: skip
    here = os.path.dirname(__file__)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_metrics(tmp_path / "ddp")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["num_turns/mean"] >= 1 and r["sys/samples_seen"] == r["step"] * 8 for r in rows)


def test_agent_demo_cli_tiny(tmp_path):
    out = tmp_path / "agent"
    cmd = [sys.executable, "-m", "grpolab", "demo", "--agent", "--size", "tiny", "--out", str(out), "log.progress=false"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = (out / "report.md").read_text()
    assert "tool-call rate" in report and "| SFT |" in report and "| GRPO |" in report
    assert "GRPO: accuracy" in done.stdout
