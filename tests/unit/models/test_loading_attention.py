"""model.attn_implementation: checked before any model loads, and given to from_pretrained (policy, critic)."""

from __future__ import annotations

import pytest

from grpolab.config import ConfigError, load_config
from grpolab.models.loading import load_policy
from grpolab.runtime.preflight import check_model_source


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from grpolab.tasks.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("attn"), hidden_size=32, num_layers=1, num_heads=2)


def test_an_unknown_name_and_flash_on_a_cpu_are_config_errors():
    with pytest.raises(ConfigError, match=r"model.attn_implementation='fast' is not an attention implementation"):
        load_config(None, ["model.attn_implementation=fast"])
    with pytest.raises(ConfigError, match="runs on CUDA only: use sdpa with model.device=cpu"):
        load_config(None, ["model.attn_implementation=flash_attention_2", "model.device=cpu"])
    load_config(None, ["model.attn_implementation=kernels-community/flash-attn"])  # a kernels-hub id passes


def test_flash_without_cuda_stops_before_the_model_loads(tiny, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = load_config(None, [f"model.name_or_path={tiny}", "model.attn_implementation=flash_attention_2"])
    with pytest.raises(ConfigError, match="runs on CUDA only and this run is on cpu"):
        check_model_source(cfg.model)


def test_flash_without_its_package_names_the_install(monkeypatch):
    import importlib.util

    from grpolab.config.checks import check_attention_runtime

    cfg = load_config(None, ["model.attn_implementation=flash_attention_2"])
    real = importlib.util.find_spec
    missing = {"flash_attn", "kernels"}
    def find_spec(name, *a):
        if name in missing:
            return None
        return object() if name == "kernels" else real(name, *a)  # kernels "installed" once not missing

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ConfigError, match="needs the flash_attn package.*pip install flash-attn"):
        check_attention_runtime(cfg.model, "cuda")
    missing.discard("kernels")  # transformers then takes the kernels hub's flash attention
    check_attention_runtime(cfg.model, "cuda")


def test_a_kernels_hub_id_without_the_kernels_package_stops_before_the_model_loads(tiny, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "kernels" else real(name, *a))
    cfg = load_config(None, [f"model.name_or_path={tiny}", "model.attn_implementation=kernels-community/flash-attn"])
    with pytest.raises(ConfigError, match=r"kernels-community/flash-attn is a kernels-hub id.*pip install kernels, or use sdpa"):
        check_model_source(cfg.model)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "kernels" else real(name, *a))
    check_model_source(cfg.model)  # installed: transformers fetches the kernel when the model loads


@pytest.mark.parametrize("name", ["eager", "sdpa"])
def test_the_policy_and_the_critic_load_with_the_chosen_attention(tiny, name):
    import torch

    from grpolab.training.spec import ValueModelSpec
    from grpolab.training.value import load_value_model

    cfg = load_config(None, [f"model.name_or_path={tiny}", f"model.attn_implementation={name}", "algo.name=ppo"])
    model, _ = load_policy(cfg.model)
    assert model.config._attn_implementation == name
    critic = load_value_model(ValueModelSpec(cfg.model), torch.device("cpu"))
    assert critic.body.config._attn_implementation == name
