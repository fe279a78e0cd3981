"""TRL's quickstart through grpolab's Python API: TRL's reward functions and a datasets.Dataset, unchanged."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from grpolab.api import GRPOTrainer
from grpolab.api import train as api_train
from grpolab.runtime.logging import read_metrics

datasets = pytest.importorskip("datasets")


def reward_num_unique_chars(completions, **kwargs):
    """TRL's quickstart reward (docs: "Quick start", GRPOTrainer)."""
    return [float(len(set(c))) for c in completions]


def _args(out, steps):
    return {
        "rollout": {"num_generations": 2, "max_completion_length": 4},
        "train": {"prompts_per_step": 2, "num_steps": steps},
        "log": {"output_dir": str(out), "run_name": "api", "progress": False, "samples_every": 1},
    }


def test_trl_quickstart_with_a_dataset_and_trl_rewards(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "unit" / "rewards"))
    from trl_rewards import format_reward

    dataset = datasets.Dataset.from_list([{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(4) for b in range(2)])
    trainer = GRPOTrainer(
        tiny_model_dir, reward_funcs=[reward_num_unique_chars, format_reward], args=_args(tmp_path, 2), train_dataset=dataset
    )
    result = trainer.train()

    assert result.final_step == 2
    metrics = read_metrics(result.run_dir)
    assert [m["step"] for m in metrics] == [1, 2]
    samples = [json.loads(line) for line in (result.run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 2 * 2
    for s in samples:  # each TRL function was called on the completion's text, and the total is their sum
        unique = float(len(set(s["completion"])))
        fmt = 1.0 if re.match(r"^<think>.*?</think><answer>.*?</answer>$", s["completion"]) else 0.0
        assert s["reward/reward_num_unique_chars"] == unique and s["reward/format_reward"] == fmt
        assert s["reward"] == pytest.approx(unique + fmt, abs=1e-6)
    for m in metrics:
        step = [s for s in samples if s["step"] == m["step"]]
        assert m["reward"] == pytest.approx(sum(s["reward"] for s in step) / len(step), abs=1e-6)
        assert m["rewards/format_reward/mean"] == pytest.approx(sum(s["reward/format_reward"] for s in step) / len(step), abs=1e-6)
    assert trainer.args.reward.functions[0].kind == "trl"


def test_one_call_with_a_list_of_rows_and_a_builtin_reward_name(tiny_model_dir, tmp_path):
    rows = [{"prompt": f"{a}+1=", "answer": str(a + 1)} for a in range(4)]
    args = {**_args(tmp_path, 1), "model": {"name_or_path": tiny_model_dir}}
    result = api_train(args, reward_funcs=["exact_match"], train_dataset=rows)
    (m,) = read_metrics(result.run_dir)
    assert m["step"] == 1 and 0.0 <= m["reward"] <= 1.0 and "rewards/exact_match/mean" in m


def test_trl_quickstart_with_trls_own_grpo_config(tiny_model_dir, tmp_path):
    """TRL's documented quickstart, its imports changed to grpolab's GRPOTrainer; the rest is TRL's, with a
    tiny model and a local dataset (CPU: use_cpu, bf16 off; a short run)."""
    trl = pytest.importorskip("trl", reason="TRL's GRPOConfig object needs trl installed (pip install 'grpolab[trl]')")
    dataset = datasets.Dataset.from_list([{"prompt": f"Summarize: {w} {w}"} for w in "abcdef"])
    training_args = trl.GRPOConfig(
        output_dir=str(tmp_path / "Qwen2-0.5B-GRPO"), logging_steps=1, log_completions=True, use_cpu=True, bf16=False,
        max_steps=4, per_device_train_batch_size=4, num_generations=2, max_completion_length=4, report_to="none",
    )
    trainer = GRPOTrainer(
        model=tiny_model_dir, reward_funcs=reward_num_unique_chars, args=training_args, train_dataset=dataset
    )
    cfg = trainer.args
    # 4 completions per device / 2 generations = 2 prompts per generation batch, one optimizer step each
    assert (cfg.train.prompts_per_step, cfg.rollout.num_generations, cfg.algo.num_minibatches) == (2, 2, 1)
    assert (cfg.train.num_steps, cfg.optim.lr, cfg.algo.beta, cfg.algo.loss_agg) == (4, 1e-6, 0.0, "token-mean")
    assert (cfg.log.output_dir, cfg.log.run_name) == (str(tmp_path), "Qwen2-0.5B-GRPO")
    assert trainer.trl_conversion is not None and "model.name_or_path" not in trainer.trl_conversion.keys
    result = trainer.train()

    assert result.final_step == 4 and result.run_dir == tmp_path / "Qwen2-0.5B-GRPO"
    samples = [json.loads(line) for line in (result.run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 * 2 * 2
    for s in samples:
        assert s["reward"] == float(len(set(s["completion"])))


def test_a_trl_config_field_grpolab_cannot_reproduce_is_one_error_naming_it(tiny_model_dir, tmp_path):
    trl = pytest.importorskip("trl", reason="TRL's GRPOConfig object needs trl installed (pip install 'grpolab[trl]')")
    from grpolab.errors import ConfigError

    args = trl.GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, neftune_noise_alpha=5.0)
    with pytest.raises(ConfigError, match=r"args \(TRL's GRPOConfig; world size 1, from WORLD_SIZE.*neftune_noise_alpha=5.0: grpolab adds no"):
        GRPOTrainer(tiny_model_dir, reward_funcs=reward_num_unique_chars, args=args, train_dataset=[{"prompt": "a"}])
