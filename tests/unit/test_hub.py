"""A hub id that cannot be fetched fails at once, in one line; a cached one loads without the network."""

import time

import pytest

import grpolab.models.hub as hub
from grpolab.models.hub import HubUnavailable, hub_load_kwargs


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


def test_offline_and_not_cached_is_one_line_naming_the_key(empty_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(HubUnavailable) as err:
        hub_load_kwargs("nobody/not-cached", None, "model.name_or_path")
    assert time.perf_counter() - start < 5
    assert "model.name_or_path 'nobody/not-cached' is not a local folder and not in the Hugging Face cache" in str(
        err.value
    )
    assert "HF_HUB_OFFLINE=1" in str(err.value) and "\n" not in str(err.value)


def test_an_unreachable_hub_is_named(empty_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(hub, "offline_mode", lambda: False)
    monkeypatch.setattr(hub, "hub_reachable", lambda: False)
    with pytest.raises(HubUnavailable, match="the Hugging Face Hub is unreachable from this machine"):
        hub_load_kwargs("nobody/not-cached", None, "model.tokenizer")


def test_a_cached_model_loads_from_the_cache_and_a_local_folder_needs_nothing(empty_cache, tmp_path, monkeypatch):
    snapshot = empty_cache / "models--nobody--cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (empty_cache / "models--nobody--cached" / "refs").mkdir()
    (empty_cache / "models--nobody--cached" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_load_kwargs("nobody/cached", None, "model.name_or_path") == {"local_files_only": True}
    assert hub_load_kwargs(str(tmp_path), None, "model.name_or_path") == {}
    monkeypatch.setattr(hub, "offline_mode", lambda: False)
    monkeypatch.setattr(hub, "hub_reachable", lambda: True)
    assert hub_load_kwargs("nobody/not-cached", None, "model.name_or_path") == {}  # online: transformers fetches it
