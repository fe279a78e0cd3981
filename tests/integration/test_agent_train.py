"""Multi-turn GRPO through the real paths: the library loop, exact resume, torchrun with 2 ranks, the
agent demo's CLI. A tiny model with a chat template plays the calculator environment."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from grpolab.config import load_config
from grpolab.config.presets import ALGO_PRESETS
from grpolab.runtime.logging import read_metrics
from grpolab.commands.train import train


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


def test_process_supervision_with_turns_as_steps(chat_model_dir, tmp_path):
    over = [*_overrides(chat_model_dir, tmp_path, "turns", 1), "algo.supervision=process"]
    rows = read_metrics(train(load_config(None, over)).run_dir)
    assert [r["step"] for r in rows] == [1]
    # every valid episode has one step per model turn (the env reward applies to all of them)
    assert rows[0]["rollout/steps_mean"] == pytest.approx(rows[0]["num_turns/mean"])
    assert "train/step_reward_mean" in rows[0]


@pytest.fixture(scope="module")
def tool_model_dir(chat_model_dir, tmp_path_factory) -> str:
    """The chat model after 60 steps of SFT on calculator traces (agent_demo.sft_traces, every trace with
    a call): it writes calls, so its episodes have environment tokens between two model turns."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpolab.commands.agent_demo import sft_traces
    from grpolab.envs import ToolLimits, build_environment
    from grpolab.tasks.arithmetic import multiplication_examples
    from grpolab.training.logprobs import completion_logprobs

    path = tmp_path_factory.mktemp("tool_chat")
    tok, model = AutoTokenizer.from_pretrained(chat_model_dir), AutoModelForCausalLM.from_pretrained(chat_model_dir)
    make_env = build_environment("calculator", {"call_format": "python"}, ToolLimits())
    prompts, episodes, masks = sft_traces(multiplication_examples(size=16, seed=0), tok, make_env, seed=0, tool_fraction=1.0)
    width = max(map(len, episodes))
    ids = torch.tensor([e + [tok.pad_token_id] * (width - len(e)) for e in episodes])
    sampled = torch.tensor([m + [False] * (width - len(m)) for m in masks])
    counted = torch.tensor([[j < len(e) for j in range(width)] for e in episodes])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(60):
        logprobs, _ = completion_logprobs(model, prompts, ids, counted, pad_id=tok.pad_token_id)
        loss = -(logprobs * sampled).sum() / sampled.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _preset_overrides(model_dir, out, name) -> list[str]:
    return [
        f"model.name_or_path={model_dir}", "model.autocast=none", "data.source=multiplication", "data.size=8",
        "env.name=calculator", "env.kwargs={call_format: python}", "env.max_turns=2", "env.max_episode_tokens=48",
        "reward.functions=[{name: env}, {name: 'toy_rewards:digit_fraction'}]", "rollout.num_generations=4",
        "rollout.max_completion_length=24", "train.prompts_per_step=2", "train.num_steps=1", "optim.lr=1e-3",
        f"log.output_dir={out}", f"log.run_name={name}", "log.checkpoint_every=0", "log.progress=false",
        f"algo.name={name}",
    ]  # fmt: skip


@pytest.mark.parametrize("preset", sorted(ALGO_PRESETS))
def test_one_env_step_under_every_preset(tool_model_dir, tmp_path, preset):
    over = _preset_overrides(tool_model_dir, tmp_path, preset)
    if ALGO_PRESETS[preset]["num_minibatches"] > 2:  # 16 / 4 mini-batches need 16 / 4 groups a step
        over.append("algo.num_minibatches=2")
    rows = read_metrics(train(load_config(None, over)).run_dir)
    assert [r["step"] for r in rows] == [1]
    row = rows[0]
    assert row["num_turns/max"] == 2 and row["tools/call_frequency"] > 0
    assert 0 < row["rollout/model_token_frac"] < 1  # env tokens in the batch, masked out of the loss
    assert math.isfinite(row["loss"])
