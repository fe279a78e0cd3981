"""What TRL's GRPOTrainer users read and do, through grpolab.GRPOTrainer: the models after construction,
TRL's defaults (bf16, gradient checkpointing) on a CPU."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from grpolab.api import GRPOTrainer
from grpolab.errors import ConfigError

ROWS = [{"prompt": f"{a}+{b}="} for a in range(3) for b in range(2)]
NORM = "model.norm.weight"


def reward_len(completions, **kwargs):
    return [float(len(c)) for c in completions]


def _args(out, steps=2, **model):
    return {
        "model": {"device": "cpu", **model},
        "rollout": {"num_generations": 2, "max_completion_length": 4},
        "train": {"prompts_per_step": 2, "num_steps": steps},
        "optim": {"lr": 1e-2},
        "algo": {"beta": 0.04},
        "log": {"output_dir": str(out), "run_name": "trl", "progress": False},
    }


TRL_STEP_KEYS = {  # what TRL 1.16's GRPOTrainer logs under these names, for the same quantities
    "loss", "policy_loss", "entropy", "entropy_coef", "kl", "grad_norm", "learning_rate", "num_tokens", "reward",
    "reward_std", "frac_reward_zero_std", "rewards/reward_len/mean", "rewards/reward_len/std", "completions/mean_length",
    "completions/min_length", "completions/max_length", "completions/clipped_ratio", "clip_ratio/low_mean",
    "clip_ratio/high_mean", "clip_ratio/region_mean",
}


def _halve_the_final_norm(model) -> None:
    """The policy then differs from the reference (loaded before), so the KL term moves every other weight."""
    with torch.no_grad():
        model.get_parameter(NORM).fill_(0.5)


def test_the_models_exist_after_construction_and_train_trains_those_very_objects(tiny_model_dir, tmp_path):
    trainer = GRPOTrainer(tiny_model_dir, reward_len, args=_args(tmp_path), train_dataset=ROWS)
    model, ref = trainer.model, trainer.ref_model
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert trainer.processing_class.pad_token_id is not None
    assert ref is not None and ref is not model and not any(p.requires_grad for p in ref.parameters())
    _halve_the_final_norm(model)
    model.get_parameter(NORM).requires_grad_(False)  # a change made before train() counts
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ref_before = {n: p.detach().clone() for n, p in ref.named_parameters()}

    trainer.train()

    assert trainer.model is model
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == set(before) - {NORM}
    assert torch.equal(model.get_parameter(NORM), torch.full_like(before[NORM], 0.5))
    assert all(torch.equal(p, ref_before[n]) for n, p in ref.named_parameters())  # frozen (no ref reset)
    saved = load_file(trainer.save_model(tmp_path / "saved") / "model.safetensors")
    assert torch.equal(saved[NORM], torch.full_like(before[NORM], 0.5))  # the run saved the object it trained


def test_under_torchrun_the_models_load_in_train(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # no process group is joined: construction only
    trainer = GRPOTrainer(tiny_model_dir, reward_len, args=_args(tmp_path), train_dataset=ROWS)
    assert (trainer.model, trainer.processing_class, trainer.ref_model) == (None, None, None)


def test_bf16_with_gradient_checkpointing_trains_on_a_cpu(tiny_model_dir, tmp_path):
    """TRL's defaults (bf16=True, gradient_checkpointing=True) on a CPU: the forward runs the plain attention
    (models/inference.py), and the backward's recomputation must run it too."""
    args = _args(tmp_path, autocast="bf16", gradient_checkpointing=True)
    trainer = GRPOTrainer(tiny_model_dir, reward_len, args=args, train_dataset=ROWS)
    assert trainer.model.is_gradient_checkpointing
    _halve_the_final_norm(trainer.model)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    result = trainer.train()

    assert result.final_step == 2 and math.isfinite(result.last_metrics["loss"])
    assert all(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())



def _custom_code_model(folder) -> str:
    """A model whose config.json maps AutoModelForCausalLM to code in the folder (as TRL's tiny-RemoteForCausalLM)."""
    from grpolab.tasks.tiny import save_tiny

    path = save_tiny(folder, hidden_size=32, num_layers=1, num_heads=2)
    (folder / "configuration_remote.py").write_text(
        "from transformers import Qwen2Config\n\nclass RemoteConfig(Qwen2Config):\n    model_type = 'remote_tiny'\n"
    )
    (folder / "modeling_remote.py").write_text(
        "from transformers import Qwen2ForCausalLM\nfrom .configuration_remote import RemoteConfig\n\n"
        "class RemoteForCausalLM(Qwen2ForCausalLM):\n    config_class = RemoteConfig\n"
    )
    config = json.loads((folder / "config.json").read_text())
    config |= {"model_type": "remote_tiny", "architectures": ["RemoteForCausalLM"], "auto_map": {
        "AutoConfig": "configuration_remote.RemoteConfig", "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM"}}
    (folder / "config.json").write_text(json.dumps(config))
    return path


def test_a_custom_code_model_loads_only_with_trust_remote_code(tmp_path):
    source = _custom_code_model(tmp_path / "remote")
    with pytest.raises(ConfigError, match=r"contains custom code .*model.trust_remote_code=true"):
        GRPOTrainer(source, reward_len, args=_args(tmp_path), train_dataset=ROWS)
    trainer = GRPOTrainer(source, reward_len, args={**_args(tmp_path), "model.trust_remote_code": True}, train_dataset=ROWS)
    assert type(trainer.model).__name__ == "RemoteForCausalLM"


def test_log_history_has_trls_names_and_ends_with_the_train_loss_row(tiny_model_dir, tmp_path):
    args = {**_args(tmp_path, steps=3), "algo.entropy_coef": 0.01}
    trainer = GRPOTrainer(tiny_model_dir, reward_len, args=args, train_dataset=ROWS)
    result = trainer.train()

    *steps, last = trainer.state.log_history
    assert [r["step"] for r in steps] == [1, 2, 3] and trainer.state.global_step == 3
    assert all(set(r) >= TRL_STEP_KEYS for r in steps)
    assert steps[0]["entropy_coef"] == 0.01
    assert set(last) == {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "step"}
    assert last["step"] == result.final_step == 3
    assert last["train_loss"] == pytest.approx(sum(r["loss"] for r in steps) / 3, rel=1e-12)
    assert last["train_steps_per_second"] == pytest.approx(3 / last["train_runtime"])
    assert last["train_samples_per_second"] == pytest.approx(3 * 2 * 2 / last["train_runtime"])  # completions


def progress_reward(completions, trainer_state, log_metric, log_extra, **kwargs):
    """Reads the run's progress, logs a metric (and one named like grpolab's own) and a sample column."""
    log_metric("progress", trainer_state.global_step / trainer_state.max_steps)
    log_metric("reward", 7.0)
    log_extra("first_char", [c[:1] for c in completions])
    return [float(len(c)) for c in completions]


def test_trl_rewards_get_trainer_state_and_their_logs_reach_metrics_and_samples(tiny_model_dir, tmp_path):
    args = {**_args(tmp_path, steps=2), "log.samples_every": 1}
    trainer = GRPOTrainer(tiny_model_dir, progress_reward, args=args, train_dataset=ROWS)
    result = trainer.train()

    rows = trainer.state.log_history[:-1]
    assert [r["progress"] for r in rows] == [0 / 2, 1 / 2]  # global_step: the steps done before each
    assert [r["log_metric/reward"] for r in rows] == [7.0, 7.0] and rows[0]["reward"] != 7.0
    samples = [json.loads(line) for line in (result.run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 2 * 2 and all(s["first_char"] == s["completion"][:1] for s in samples)


def test_a_moe_model_from_trls_config_notes_the_load_balancing_loss_trl_would_add(tmp_path, caplog):
    """TRL 1.16 adds a Mixture-of-Experts model's router loss when router_aux_loss_coef is unset; grpolab adds
    none: aux_loss_enabled is False (TRL's test reads it) and a warning names the coefficient TRL would use."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig
    from trl import GRPOConfig

    from grpolab.tasks.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    config = Qwen3MoeConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                            num_experts=2, num_experts_per_tok=1, router_aux_loss_coef=0.25)  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "moe")
    tok.save_pretrained(tmp_path / "moe")
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=4, use_cpu=True, bf16=False, report_to="none")  # fmt: skip
    with caplog.at_level("WARNING", logger="grpolab"):
        trainer = GRPOTrainer(str(tmp_path / "moe"), reward_len, args=args, train_dataset=ROWS)
    assert trainer.aux_loss_enabled is False
    assert "Qwen3Moe is a Mixture-of-Experts model: TRL would add its load-balancing loss (router_aux_loss_coef 0.25" in caplog.text


def test_the_final_row_carries_what_trl_had_not_logged_since_its_last_logging_steps_row():
    from grpolab.api_models import unlogged_by_trl

    rows = [{"step": 1, "reward": 1.0}, {"step": 2, "reward": 2.0}, {"step": 3, "reward": 4.0, "flag": True, "loss": 1.0}]
    assert unlogged_by_trl(rows, 3, logging_steps=2, updates_per_step=1) == {"reward": 4.0}  # logged at 2
    assert unlogged_by_trl(rows, 3, logging_steps=4, updates_per_step=1) == {"reward": 7 / 3}  # never logged
    assert unlogged_by_trl(rows, 3, logging_steps=4, updates_per_step=2) == {"reward": 4.0}  # 6 updates, logged at 4
    assert unlogged_by_trl(rows, 3, logging_steps=3, updates_per_step=1) == {}  # logged at the last step


def test_a_trl_config_s_run_ends_with_trls_final_row(tiny_model_dir, tmp_path):
    from trl import GRPOConfig

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, max_completion_length=4,
                      max_steps=3, logging_steps=2, use_cpu=True, bf16=False, report_to="none")  # fmt: skip
    trainer = GRPOTrainer(tiny_model_dir, reward_len, args=args, train_dataset=ROWS)
    trainer.train()
    *steps, final = trainer.state.log_history
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert final["reward"] == steps[2]["reward"]  # TRL logged at step 2; step 3's metrics wait for the end
    assert "loss" not in final  # transformers' Trainer logs the loss at logging steps only
    assert final["train_loss"] == pytest.approx(sum(r["loss"] for r in steps) / 3, rel=1e-6)
