"""PPO (with its critic), RLOO and online RFT end to end on the tiny model; PPO's checkpoint resumes exactly."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpolab.config import load_config
from grpolab.runtime.checkpoint import latest_checkpoint
from grpolab.runtime.logging import read_metrics
from grpolab.commands.train import train

sys.path.insert(0, str(Path(__file__).parent))  # toy_rewards


@pytest.fixture(scope="module")
def dataset(addition_jsonl) -> Path:
    return addition_jsonl(64)


def _cfg(model_dir, dataset, out, name, steps, *extra):
    return load_config(
        None,
        [
            f"model.name_or_path={model_dir}",
            f"data.path={dataset}",
            "reward.functions=[{name: exact_match}, {name: 'toy_rewards:digit_fraction', weight: 10}]",
            "rollout.num_generations=4",
            "rollout.max_completion_length=4",
            "train.prompts_per_step=2",
            f"train.num_steps={steps}",
            "train.micro_batch_size=4",
            "optim.lr=1e-3",
            f"log.output_dir={out}",
            f"log.run_name={name}",
            "log.checkpoint_every=1",
            "log.progress=false",
            "log.tensorboard=false",
            *extra,
        ],
    )


def _changed(before: dict, after: dict, prefix: str = "") -> bool:
    return any(not torch.equal(before[k], after[prefix + k]) for k in before if prefix + k in after)


def test_ppo_trains_policy_and_critic(tiny_model_dir, dataset, tmp_path):
    cfg = _cfg(
        tiny_model_dir, dataset, tmp_path, "ppo", 2, "algo.name=ppo", "algo.mu=2", "algo.value_lr=3e-3"
    )
    result = train(cfg)
    rows = read_metrics(result.run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        for key in (
            "loss",
            "loss/value",
            "kl",
            "train/value_grad_norm",
            "train/value_explained_var",
        ):
            assert math.isfinite(r[key]), key
        assert r["train/value_lr"] == pytest.approx(3e-3) and r["learning_rate"] == pytest.approx(1e-3)
        assert r["sys/time_value_forward_s"] > 0 and r["sys/time_value_update_s"] > 0
    assert rows[0]["train/value_mean"] == 0.0  # zero head at the start: V = 0
    assert rows[1]["train/value_mean"] != 0.0
    last = latest_checkpoint(result.run_dir)
    initial = load_file(f"{tiny_model_dir}/model.safetensors")
    assert _changed(initial, load_file(last / "model.safetensors"))
    value = load_file(last / "value.safetensors")
    body = {k.removeprefix("model."): v for k, v in initial.items() if k.startswith("model.")}
    assert _changed(body, value, prefix="body.")  # the critic's body moved off the policy's initial weights
    assert value["head.weight"].abs().sum() > 0
    info = json.loads((result.run_dir / "run_info.json").read_text())
    models = info["models"]
    assert models["reference"] == models["policy"] and models["reward"] is None
    hidden = 64
    assert models["value"] == models["policy"] + hidden + 1  # tied LM head: the body plus a scalar head


def test_critic_warmup_trains_only_the_critic(tiny_model_dir, dataset, tmp_path):
    cfg = _cfg(tiny_model_dir, dataset, tmp_path, "warm", 1, "algo.name=ppo", "algo.critic_warmup_steps=1")
    result = train(cfg)
    row = read_metrics(result.run_dir)[0]
    assert "loss" not in row and math.isfinite(row["loss/value"])
    last = latest_checkpoint(result.run_dir)
    initial = load_file(f"{tiny_model_dir}/model.safetensors")
    assert not _changed(initial, load_file(last / "model.safetensors"))
    assert load_file(last / "value.safetensors")["head.weight"].abs().sum() > 0


def test_ppo_resume_matches_an_uninterrupted_run(tiny_model_dir, dataset, tmp_path):
    extra = ("algo.name=ppo", "algo.num_minibatches=2")
    straight = train(_cfg(tiny_model_dir, dataset, tmp_path, "straight", 3, *extra))
    train(_cfg(tiny_model_dir, dataset, tmp_path, "resumed", 2, *extra))
    resumed = train(_cfg(tiny_model_dir, dataset, tmp_path, "resumed", 3, *extra), resume=True)
    a, b = read_metrics(straight.run_dir), read_metrics(resumed.run_dir)
    assert [r["step"] for r in b] == [1, 2, 3]
    for ra, rb in zip(a, b, strict=True):
        keep = lambda r: {k: v for k, v in r.items() if not k.startswith("sys/")}  # noqa: E731
        assert keep(ra) == keep(rb), f"step {ra['step']} differs"
    state = torch.load(latest_checkpoint(resumed.run_dir) / "trainer_state.pt", weights_only=False)
    assert {int(s["step"]) for s in state["critic"]["optimizer"]["state"].values()} == {6}  # 3 steps x 2
    va = load_file(latest_checkpoint(straight.run_dir) / "value.safetensors")
    vb = load_file(latest_checkpoint(resumed.run_dir) / "value.safetensors")
    assert all(torch.equal(va[k], vb[k]) for k in va)


@pytest.mark.parametrize("algo", ["rloo", "online_rft"])
def test_outcome_estimators_train_end_to_end(tiny_model_dir, dataset, tmp_path, algo):
    result = train(_cfg(tiny_model_dir, dataset, tmp_path, algo, 2, f"algo.name={algo}"))
    rows = read_metrics(result.run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    assert any(r["train/adv_abs_max"] > 0 for r in rows)
    initial = load_file(f"{tiny_model_dir}/model.safetensors")
    assert _changed(initial, load_file(latest_checkpoint(result.run_dir) / "model.safetensors"))
    assert json.loads((result.run_dir / "run_info.json").read_text())["models"]["value"] is None
