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
        # a wait past ~1e9 s overflowed the socket and threading modules: a traceback (NaN, inf: the loader's line)
        ({"mode": "server", "engine": "vllm", "sync_timeout_s": 1e10}, "rollout.sync_timeout_s must be > 0 and at most 86400 (a day), got 1e+10"),
        ({"mode": "server", "engine": "vllm", "server_start_timeout_s": 1e10}, "server_start_timeout_s must be > 0 and at most 86400"),
        ({"mode": "server", "engine": "vllm", "server_host": "[::1]"}, "rollout.server_host='[::1]' is not an address to bind"),
        ({"mode": "server", "engine": "vllm", "server_host": "127.0.0.1:8000"}, "without brackets, scheme or port"),
        ({"mode": "server", "engine": "vllm", "server_url": "http://[::1"}, "rollout.server_url='http://[::1' is not an http(s) URL"),
        ({"mode": "server", "engine": "vllm", "server_url": "http://127.0.0.1:99999"}, "is not an http(s) URL"),
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


def test_ipv6_loopback_is_loopback_and_a_day_is_the_longest_timeout():
    from grpolab.config.server_checks import weight_transport

    c = cfg(mode="server", engine="vllm", server_host="::1", sync_timeout_s=86400)
    assert (c.rollout.server_host, weight_transport(c.rollout, serving=True)) == ("::1", "shm")
    assert weight_transport(cfg(mode="server", engine="vllm", server_url="http://[::1]:8000").rollout) == "shm"


def test_server_mode_with_staleness_is_accepted():
    c = cfg(mode="server", engine="vllm", max_staleness=2)
    assert c.rollout.max_staleness == 2


def test_the_weight_transport_auto_resolves_by_where_the_server_is(monkeypatch):
    from grpolab.config.server_checks import weight_transport

    monkeypatch.setenv("GRPOLAB_VLLM_API_KEY", "secret")
    base = {"mode": "server", "engine": "vllm", "allow_remote": True}
    started_here = cfg(**base, server_host="0.0.0.0").rollout
    assert weight_transport(started_here) == "shm"  # a server this run starts is on this machine, on its GPUs
    assert weight_transport(started_here, serving=True) == "nccl"  # grpolab serve for trainers elsewhere
    assert weight_transport(cfg(**base, server_url="http://127.0.0.1:8000").rollout) == "shm"
    assert weight_transport(cfg(**base, server_url="http://10.1.2.3:8000").rollout) == "nccl"
    assert weight_transport(cfg(**base, server_url="http://10.1.2.3:8000", weight_transport="nccl").rollout) == "nccl"


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"weight_transport": "nccl"}, "needs a server on GPUs of its own"),
        ({"weight_transport": "shm", "server_url": "http://10.1.2.3:8000"}, "which the server at http://10.1.2.3:8000 cannot read"),
        ({"server_url": "http://10.1.2.3:8000", "lora": True}, "loads each adapter version from a folder"),
    ],
)
def test_a_trainers_transport_that_cannot_reach_its_server_is_one_line(monkeypatch, settings, says):
    from grpolab.config.server_checks import check_trainer_transport

    monkeypatch.setenv("GRPOLAB_VLLM_API_KEY", "secret")
    lora = settings.pop("lora", False)
    c = config_from_dict({"model": {"name_or_path": "unused", "lora": {"enabled": lora}},
                          "rollout": {"mode": "server", "engine": "vllm", "allow_remote": True, **settings}})  # fmt: skip
    with pytest.raises(ConfigError, match=re.escape(says)) as err:
        check_trainer_transport(c.rollout, c.model)
    assert "\n" not in str(err.value)
    fine = cfg(mode="server", engine="vllm")
    check_trainer_transport(fine.rollout, fine.model)  # a server this run starts: shm, fine


def test_grpolab_serves_server_takes_most_of_its_gpus_and_one_the_run_starts_shares_the_trainers():
    """vllm.gpu_memory_utilization null: 0.3 beside the trainer (TRL colocate's), 0.9 for grpolab serve's
    server on GPUs of its own (vLLM's and TRL vllm-serve's); a value set is kept for both."""
    from grpolab.rollout.vllm.server_setup import server_args
    from grpolab.runtime.engine_spec import engine_spec

    def share(c, serving):
        args, _ = server_args(engine_spec(c), device_type="cuda", autocast_dtype=None, context=512, serving=serving)
        return float(args[args.index("--gpu-memory-utilization") + 1])

    c = cfg(mode="server", engine="vllm")
    assert (share(c, False), share(c, True)) == (0.3, 0.9)
    c = config_from_dict({"model": {"name_or_path": "unused"}, "rollout": {"mode": "server", "engine": "vllm"},
                          "vllm": {"gpu_memory_utilization": 0.5}})  # fmt: skip
    assert (share(c, False), share(c, True)) == (0.5, 0.5)
