"""Checks on the model source before anything loads (grpolab.runtime.preflight)."""

from __future__ import annotations

import json

import pytest

from grpolab.config import ConfigError, load_config
from grpolab.runtime.preflight import check_model_source

AUTO_MAP = {"AutoConfig": "configuration_remote.RemoteConfig", "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM"}


def _folder(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def _model_cfg(source, *overrides):
    return load_config(None, [f"model.name_or_path={source}", "model.device=cpu", *overrides]).model


def test_custom_code_needs_trust_remote_code(tmp_path):
    source = _folder(tmp_path, model_type="remote_tiny", auto_map=AUTO_MAP)
    with pytest.raises(ConfigError, match=r"contains custom code \(modeling_remote.RemoteForCausalLM, config.json's "
                       r"auto_map\).*set model.trust_remote_code=true \(TRL: trust_remote_code=True\)"):
        check_model_source(_model_cfg(source))
    check_model_source(_model_cfg(source, "model.trust_remote_code=true"))


def test_an_auto_map_for_a_model_type_transformers_has_needs_no_trust(tmp_path):
    """transformers then loads its own class for it and ignores the folder's code (as from_pretrained does)."""
    check_model_source(_model_cfg(_folder(tmp_path, model_type="qwen2", auto_map=AUTO_MAP)))
