"""A model whose logits are NaN or infinite: the hf sampler raises NonFiniteLogits once per call (no
torch.multinomial traceback, no NaN log-probs handed on), the training loop turns it into one line naming
the model and the step, and a saved model holding NaN weights is refused when it loads."""

from __future__ import annotations

import json
import math

import pytest
import torch

import grpolab.models.loading as models_mod
from grpolab.cli import main
from grpolab.config import ModelConfig
from grpolab.models.loading import ModelLoadError, load_policy
from grpolab.rollout.base import NonFiniteLogits
from grpolab.rollout.hf import HFSampler
from grpolab.tasks.tiny import build_tiny_model


def _poisoned(tok, value: float):
    model = build_tiny_model(tok, hidden_size=64, num_layers=2, seed=0).eval()
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[0, 0] = value
    return model


@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_the_sampler_raises_on_nonfinite_logits(tok, prompts, temperature, value):
    sampler = HFSampler(_poisoned(tok, value), tok, max_completion_length=3, temperature=temperature)
    with pytest.raises(NonFiniteLogits, match=r"logits were NaN or infinite while sampling"):
        sampler.sample(prompts, num_generations=2, generator=torch.Generator().manual_seed(0))


def test_minus_inf_logits_of_some_tokens_are_not_an_error(tok, prompts, model):
    sampler = HFSampler(model, tok, max_completion_length=3, temperature=1.0)
    head = model.lm_head
    bias = torch.zeros(model.config.vocab_size)
    bias[5] = -math.inf  # a token the model can never emit: a legitimate distribution
    head.bias = torch.nn.Parameter(bias)
    try:
        out = sampler.sample(prompts, num_generations=2, generator=torch.Generator().manual_seed(0))
    finally:
        head.bias = None
    assert torch.isfinite(out.logprobs).all() and not (out.completion_ids[out.completion_mask] == 5).any()


def test_a_saved_model_with_nan_weights_is_refused_at_load(tok, tmp_path):
    model = _poisoned(tok, math.nan)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    with pytest.raises(ModelLoadError, match=r"weight 'model.layers.1.mlp.down_proj.weight' holds NaN or infinite"):
        load_policy(ModelConfig(name_or_path=str(tmp_path / "m"), device="cpu"))


def test_training_stops_with_one_line_naming_the_model_and_the_step(tok, tmp_path, addition_jsonl, capsys,
                                                                    monkeypatch):
    """Finite at load, NaN logits when sampling (check_finite_weights passed over, as for an fp16 overflow)."""
    folder = tmp_path / "m"
    _poisoned(tok, math.nan).save_pretrained(folder)
    tok.save_pretrained(folder)
    monkeypatch.setattr(models_mod, "check_finite_weights", lambda model, source: None)
    out = tmp_path / "runs"
    capsys.readouterr()  # save_pretrained's progress bars
    code = main([
        "train", f"model.name_or_path={folder}", f"data.path={addition_jsonl(8)}",
        "reward.functions=[{name: exact_match}]", "rollout.num_generations=2", "rollout.max_completion_length=3",
        "train.prompts_per_step=2", "train.num_steps=2", f"log.output_dir={out}", "log.run_name=r", "log.progress=false",
    ])  # fmt: skip
    assert code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("grpolab")]  # not tqdm's bars
    assert len(err) == 1 and err[0].startswith("grpolab: error: step 1: the model's logits were NaN or infinite")
    assert f"in model '{folder}'" in err[0] and "no checkpoint was written yet" in err[0]
    metrics = out / "r" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    assert rows == []  # nothing of the failed step logged, so no NaN written either
    assert not (out / "r" / "checkpoints").exists() or not any((out / "r" / "checkpoints").iterdir())
