"""GRPO with bf16-stored weights: fp32 master weights, a token budget, and an exact resume."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from grpolab.config import load_config
from grpolab.runtime.checkpoint import latest_checkpoint
from grpolab.commands.train import train


def _overrides(model_dir, data, out, name, steps) -> list[str]:
    return [
        f"model.name_or_path={model_dir}",
        "model.dtype=bfloat16",
        f"data.path={data}",
        "reward.functions=[{name: exact_match}, {name: 'toy_rewards:digit_fraction'}]",
        "rollout.num_generations=4",
        "rollout.max_completion_length=4",
        "train.prompts_per_step=2",
        f"train.num_steps={steps}",
        "train.micro_batch_size=4",
        "train.max_tokens_per_micro_batch=24",
        "optim.lr=1e-3",
        f"log.output_dir={out}",
        f"log.run_name={name}",
        "log.checkpoint_every=1",
        "log.progress=false",
        "log.tensorboard=false",
        "data.eval_size=0",
    ]


def test_bf16_run_moves_its_weights_and_resumes_exactly(tiny_model_dir, addition_jsonl, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # toy_rewards
    data = addition_jsonl(32)
    full = train(load_config(None, _overrides(tiny_model_dir, data, tmp_path, "full", 2)))
    train(load_config(None, _overrides(tiny_model_dir, data, tmp_path, "part", 1)))
    resumed = train(load_config(None, _overrides(tiny_model_dir, data, tmp_path, "part", 2)), resume=True)
    a = load_file(latest_checkpoint(full.run_dir) / "model.safetensors")
    b = load_file(latest_checkpoint(resumed.run_dir) / "model.safetensors")
    start = load_file(f"{tiny_model_dir}/model.safetensors")
    assert all(v.dtype == torch.bfloat16 for v in a.values())
    assert all(torch.equal(a[k], b[k]) for k in a)  # the fp32 master weights were saved and restored
    moved = sum(int((a[k] != start[k].to(torch.bfloat16)).sum()) for k in a) / sum(v.numel() for v in a.values())
    assert moved > 0.5  # at lr 1e-3 most bf16 weights move
