"""model.compile: the policy's decoder layers (and its reference copy's) compiled with torch.compile train as the
uncompiled ones do, to the rounding of a fused kernel; the sampler runs its forwards uncompiled."""

from __future__ import annotations

import copy

import pytest
import torch
from test_torchrun import strip

from grpolab.cli import main
from grpolab.models.inference import WeightCopy, eager_calls
from grpolab.models.loading import ModelLoadError, Reference, compile_layers
from grpolab.runtime.logging import read_metrics

STEPS = 2


def _overrides(model_dir, data, out, name: str, *extra: str) -> list[str]:
    return [
        f"model.name_or_path={model_dir}", "model.autocast=none", f"data.path={data}",
        "reward.functions=[{name: 'toy_rewards:digit_fraction'}]",
        "rollout.num_generations=4", "rollout.max_completion_length=6", "train.prompts_per_step=2",
        f"train.num_steps={STEPS}", "optim.lr=1e-3", "algo.beta=0.04", f"log.output_dir={out}", f"log.run_name={name}",
        "log.progress=false", *extra,
    ]  # fmt: skip


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["model.gradient_checkpointing=true"],  # each layer's forward recomputed in the backward, compiled both times
        ["model.lora.enabled=true", "model.lora.r=4", "optim.lr=1e-2"],  # the reference: the policy, adapter off
    ],
    ids=["plain", "checkpointing", "lora"],
)
def test_a_compiled_policy_trains_as_the_uncompiled_one(tiny_model_dir, addition_jsonl, tmp_path, extra):
    data = addition_jsonl(16)
    assert main(["train", *_overrides(tiny_model_dir, data, tmp_path, "eager", *extra)]) == 0
    assert main(["train", *_overrides(tiny_model_dir, data, tmp_path, "compiled", *extra, "model.compile=true")]) == 0
    want, got = strip(read_metrics(tmp_path / "eager")), strip(read_metrics(tmp_path / "compiled"))
    assert len(got) == len(want) == STEPS
    # it trained on a reward that varies within groups (a group of equal rewards leaves only the KL term, whose
    # gradient at the reference is rounding noise that AdamW scales up to lr: no comparison then), off the reference
    assert all(r["reward_std"] > 0 and r["grad_norm"] > 1e-3 for r in want) and want[1]["kl"] > 1e-6
    for a, b in zip(want, got, strict=True):
        assert a.keys() == b.keys()
        for k in a:  # the same samples (the sampler runs uncompiled), fused fp32 arithmetic in the forwards
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-5, nan_ok=True), (a["step"], k)


def test_compiled_layers_the_samplers_copy_and_a_model_without_layers(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert compile_layers(model) == model.config.num_hidden_layers
    compiled = [m for m in model.modules() if m._compiled_call_impl is not None]
    assert len(compiled) == model.config.num_hidden_layers
    reference = Reference(model, torch.bfloat16).frozen_model  # compiled as the policy is
    assert sum(m._compiled_call_impl is not None for m in reference.modules()) == len(compiled)
    assert all(m._compiled_call_impl is None for m in copy.deepcopy(model).modules())  # deepcopy drops it
    sampler_copy = WeightCopy(model, torch.bfloat16, pack=False).model  # the sampler's: uncompiled
    assert all(m._compiled_call_impl is None for m in sampler_copy.modules())
    with eager_calls(model):
        assert all(m._compiled_call_impl is None for m in model.modules())
    assert [m for m in model.modules() if m._compiled_call_impl is not None] == compiled  # restored
    with pytest.raises(ModelLoadError, match="has no transformers decoder layers to compile; set model.compile=false"):
        compile_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)))
