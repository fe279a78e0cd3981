"""rollout.mode=server's settings: one-line errors for bad combinations, before any model loads."""

from __future__ import annotations

import re

import pytest

from grpolab.config import ConfigError, config_from_dict


def cfg(**rollout):
    return config_from_dict({"model": {"name_or_path": "unused"}, "rollout": rollout})


def test_colocated_stays_the_default():
    c = cfg()
    assert c.rollout.mode == "colocated" and c.rollout.max_staleness == 0 and c.rollout.server_url == ""


@pytest.mark.parametrize(
    ("rollout", "says"),
    [
        ({"max_staleness": 1}, "rollout.max_staleness needs rollout.mode=server"),
        ({"server_url": "http://127.0.0.1:8000"}, "rollout.server_url needs rollout.mode=server"),
        ({"mode": "server"}, "set rollout.engine=vllm"),
        ({"mode": "server", "engine": "vllm", "max_staleness": -1}, "rollout.max_staleness must be >= 0"),
        ({"mode": "server", "engine": "vllm", "sync_timeout_s": 0}, "rollout.sync_timeout_s must be > 0"),
        ({"mode": "server", "engine": "vllm", "server_url": "ftp://x"}, "is not an http(s) URL"),
        ({"mode": "server", "engine": "vllm", "server_url": "http://10.1.2.3:8000"}, "rollout.allow_remote=true"),
        ({"mode": "server", "engine": "vllm", "server_host": "0.0.0.0"}, "rollout.server_host names 0.0.0.0"),
    ],
)
def test_bad_combinations_are_one_line(rollout, says):
    with pytest.raises(ConfigError, match=re.escape(says)) as err:
        cfg(**rollout)
    assert "\n" not in str(err.value)


def test_a_remote_server_needs_the_setting_and_a_key(monkeypatch):
    remote = {"mode": "server", "engine": "vllm", "server_url": "http://10.1.2.3:8000", "allow_remote": True}
    monkeypatch.delenv("GRPOLAB_VLLM_API_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"\$GRPOLAB_VLLM_API_KEY"):
        cfg(**remote)
    monkeypatch.setenv("GRPOLAB_VLLM_API_KEY", "secret")
    assert cfg(**remote).rollout.server_url == "http://10.1.2.3:8000"


def test_server_mode_with_staleness_is_accepted():
    c = cfg(mode="server", engine="vllm", max_staleness=2)
    assert c.rollout.max_staleness == 2
