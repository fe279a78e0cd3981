"""The value model: loads from a causal LM or a reward model, and values[:, t] is V(prompt, completion[:t])."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from grpolab.config import ModelConfig
from grpolab.models.loading import ModelLoadError
from grpolab.training.spec import ValueModelSpec
from grpolab.training.value import load_value_model, token_values

PROMPTS = [[5, 6, 7], [8, 9]]
COMPLETIONS = torch.tensor([[10, 11, 2], [12, 2, 0]])
MASK = torch.tensor([[True, True, True], [True, True, False]])


@pytest.fixture(scope="module")
def reward_model_dir(tiny_model_dir, tmp_path_factory) -> str:
    """A sequence classifier (1 label) on the tiny model's body, with a non-zero random head."""
    torch.manual_seed(1)
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    torch.nn.init.normal_(rm.score.weight, std=0.5)
    path = tmp_path_factory.mktemp("rm")
    rm.save_pretrained(path)
    return str(path)


def test_value_model_from_the_policy_starts_at_zero_with_the_policy_body(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    value = load_value_model(ValueModelSpec(ModelConfig(name_or_path=tiny_model_dir)), torch.device("cpu"))
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    body = dict(value.body.named_parameters())
    for name, p in policy.get_decoder().named_parameters():
        assert torch.equal(body[name], p), name
    with torch.no_grad():
        v = token_values(value, PROMPTS, COMPLETIONS, MASK, pad_id=0)
    assert v.shape == (2, 3) and torch.equal(v, torch.zeros(2, 3))


def test_values_are_the_reward_models_score_of_each_prefix(tiny_model_dir, reward_model_dir):
    spec = ValueModelSpec(ModelConfig(name_or_path=tiny_model_dir), init="reward_model", init_path=reward_model_dir)
    value = load_value_model(spec, torch.device("cpu"))
    rm = AutoModelForSequenceClassification.from_pretrained(reward_model_dir).eval()
    value.eval()
    with torch.no_grad():
        v = token_values(value, PROMPTS, COMPLETIONS, MASK, pad_id=0)
        for i, prompt in enumerate(PROMPTS):
            for t in range(int(MASK[i].sum())):
                prefix = torch.tensor([prompt + COMPLETIONS[i, :t].tolist()])  # the state before token t
                score = rm(input_ids=prefix).logits[0, 0]
                assert v[i, t].item() == pytest.approx(score.item(), abs=1e-5), (i, t)
    assert v[1, 2] == 0  # outside the mask


def test_a_missing_reward_model_names_the_key(tiny_model_dir, tmp_path):
    spec = ValueModelSpec(ModelConfig(name_or_path=tiny_model_dir), init="reward_model", init_path=str(tmp_path / "nope"))
    with pytest.raises(ModelLoadError, match="algo.value_init_path"):
        load_value_model(spec, torch.device("cpu"))
