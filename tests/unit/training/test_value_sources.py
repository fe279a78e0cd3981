"""PPO's critic starts from the policy wherever the policy comes from: a GGUF file (or package:...) is read
from its converted folder, as the policy is (before, `package:` reached the hub loader and failed)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("gguf", reason="the GGUF path needs the gguf package: pip install 'grpolab[real]'")

from gguf_files import write_tiny_gguf  # noqa: E402

from grpolab.config import ModelConfig  # noqa: E402
from grpolab.training.spec import ValueModelSpec  # noqa: E402
from grpolab.training.value import load_value_model  # noqa: E402


def test_the_value_model_of_a_gguf_policy_is_the_policy_s_body(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPOLAB_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    original = write_tiny_gguf(path)
    critic = load_value_model(ValueModelSpec(ModelConfig(name_or_path=str(path), device="cpu")), torch.device("cpu"))
    body = dict(critic.body.named_parameters())
    for name, param in original.model.named_parameters():
        torch.testing.assert_close(body[name], param, rtol=0, atol=0)
    assert float(critic.head.weight.abs().sum()) == 0.0  # a zero scalar head: V = 0 at the start
