"""LoRA through PEFT: the reference is the base with the adapter disabled (no second copy)."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from grpolab.config import LoraConfig, ModelConfig, load_config
from grpolab.models.loading import Reference, load_policy
from grpolab.runtime.checkpoint import latest_checkpoint
from grpolab.runtime.logging import read_metrics
from grpolab.training.logprobs import completion_logprobs
from grpolab.commands.train import train


def test_reference_under_lora_is_the_base_model(tiny_model_dir):
    cfg = ModelConfig(name_or_path=tiny_model_dir, autocast="none", lora=LoraConfig(enabled=True, r=4))
    policy, tok = load_policy(cfg)
    base, _ = load_policy(ModelConfig(name_or_path=tiny_model_dir, autocast="none"))
    with torch.no_grad():  # make the adapter non-trivial
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    ref = Reference(policy)
    assert ref.frozen_model is None  # no second copy of the weights
    prompts = [tok("12+34=")["input_ids"]]
    completion, mask = torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.bool)
    with torch.no_grad():
        with ref.model() as ref_model:
            ref_lp, _ = completion_logprobs(ref_model, prompts, completion, mask, pad_id=0)
        base_lp, _ = completion_logprobs(base, prompts, completion, mask, pad_id=0)
        policy_lp, _ = completion_logprobs(policy, prompts, completion, mask, pad_id=0)
    torch.testing.assert_close(ref_lp, base_lp)
    assert not torch.allclose(policy_lp, base_lp)


def test_lora_grpo_trains_only_the_adapter_and_resumes(tiny_model_dir, addition_jsonl, tmp_path):
    data = addition_jsonl(16)
    overrides = [
        f"model.name_or_path={tiny_model_dir}",
        "model.lora.enabled=true",
        "model.lora.r=4",
        f"data.path={data}",
        "reward.functions=[{name: 'toy_rewards:digit_fraction'}]",
        "rollout.num_generations=4",
        "rollout.max_completion_length=4",
        "train.prompts_per_step=2",
        "optim.lr=1e-2",
        f"log.output_dir={tmp_path}",
        "log.run_name=lora",
        "log.progress=false",
        "log.checkpoint_every=1",
    ]
    train(load_config(None, [*overrides, "train.num_steps=2"]))
    last = latest_checkpoint(tmp_path / "lora")
    assert (last / "adapter_model.safetensors").exists() and not (last / "model.safetensors").exists()
    adapter = load_file(last / "adapter_model.safetensors")
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in adapter.items())  # B starts at 0: it learned
    result = train(load_config(None, [*overrides, "train.num_steps=3"]), resume=True)
    assert [r["step"] for r in read_metrics(result.run_dir)] == [1, 2, 3]
    state = torch.load(latest_checkpoint(result.run_dir) / "trainer_state.pt", weights_only=False)
    assert {int(s["step"]) for s in state["optimizer"]["state"].values()} == {3}
