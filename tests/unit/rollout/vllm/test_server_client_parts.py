"""The parts of server mode that need no vLLM server: bucket files, buckets, the bind rule, the plugin's
metadata, and a call that hangs (cut at its timeout)."""

from __future__ import annotations

import importlib.metadata
import math
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

from grpolab.rollout.vllm import shm as vllm_shm
from grpolab.rollout.vllm.server import RolloutServerError, check_bind, plugin_path
from grpolab.rollout.vllm.server_client import ServerClient, buckets


def test_a_bucket_file_round_trips_every_tensor_aligned(tmp_path):
    folder = tmp_path / "grpolab-x"
    folder.mkdir()
    tensors = [
        ("a", torch.arange(3, dtype=torch.float32)),  # 12 bytes: the next offset rounds up to 64
        ("b.weight", torch.randn(2, 5, dtype=torch.bfloat16)),
        ("c", torch.tensor([[1.5]], dtype=torch.float16)),
    ]
    info = vllm_shm.write_bucket(folder / "bucket-0", tensors)
    assert info["offsets"] == [0, 64, 128] and info["nbytes"] == 128 + 2
    assert info["shapes"] == [[3], [2, 5], [1, 1]] and info["dtype_names"] == ["float32", "bfloat16", "float16"]
    back = vllm_shm.read_bucket(info, folder)
    assert [n for n, _ in back] == ["a", "b.weight", "c"]
    for (_, want), (_, got) in zip(tensors, back, strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_a_bucket_outside_the_transfer_folder_is_refused(tmp_path):
    (tmp_path / "grpolab-x").mkdir()
    info = vllm_shm.write_bucket(tmp_path / "elsewhere", [("a", torch.ones(2))])
    with pytest.raises(ValueError, match="is not in the transfer folder"):
        vllm_shm.read_bucket(info, tmp_path / "grpolab-x")
    info["nbytes"] = 4
    with pytest.raises(ValueError, match="has 8 bytes"):
        vllm_shm.read_bucket({**info, "path": str(tmp_path / "elsewhere")}, tmp_path)
    for bad in ("../grpolab-x", "other", "grpolab-x/../../etc"):
        with pytest.raises(ValueError, match="must be a grpolab-\\* folder"):
            vllm_shm.transfer_dir(tmp_path, bad)
    assert vllm_shm.transfer_dir(tmp_path, "grpolab-x") == (tmp_path / "grpolab-x").resolve()


def test_buckets_hold_at_most_the_limit_and_a_large_tensor_alone():
    weights = [("a", torch.zeros(10)), ("b", torch.zeros(10)), ("big", torch.zeros(100)), ("c", torch.zeros(5))]
    got = [[n for n, _ in b] for b in buckets(iter(weights), limit_bytes=80)]  # 40 bytes per 10 floats
    assert got == [["a", "b"], ["big"], ["c"]]


def test_a_non_loopback_bind_needs_the_setting_and_a_key():
    check_bind("127.0.0.1", allow_remote=False, api_key=None)
    for allow, key in ((False, "k"), (True, None)):
        with pytest.raises(RolloutServerError, match="refusing to start a vLLM server on 0.0.0.0"):
            check_bind("0.0.0.0", allow_remote=allow, api_key=key)
    check_bind("0.0.0.0", allow_remote=True, api_key="k")


def test_the_plugin_folder_exposes_the_vllm_entry_point(tmp_path):
    folder = plugin_path(tmp_path)
    code = (
        "import importlib.metadata as m; "
        "print([e.value for e in m.entry_points(group='vllm.general_plugins') if e.name == 'grpolab_shm'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONPATH": str(folder)}, capture_output=True, text=True, timeout=60
    )
    assert "grpolab.rollout.vllm.shm:register" in out.stdout, out.stderr
    assert importlib.metadata  # the parent's own metadata is untouched: nothing was installed


def test_a_hung_call_is_cut_at_its_timeout():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    held = []
    threading.Thread(target=lambda: held.append(listener.accept()), daemon=True).start()  # accepts, never answers
    client = ServerClient(f"http://127.0.0.1:{port}", timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(RolloutServerError, match=r"did not answer /update_weights within 1 s \(rollout.sync_timeout_s\)"):
        client.call("POST", "/update_weights", {"update_info": {}})
    assert time.monotonic() - t0 < 3
    listener.close()


def test_a_server_that_is_gone_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    with pytest.raises(RolloutServerError, match="cannot be reached") as err:
        ServerClient(f"http://127.0.0.1:{port}", timeout_s=1.0).call("GET", "/weight_info")
    assert "\n" not in str(err.value) and "--resume" in str(err.value)


def test_the_nccl_rendezvous_is_this_machines_address_towards_the_server():
    """vLLM's NCCL rendezvous binds on the trainer (its rank 0) and the server's workers connect to it: the
    address is this machine's on the route to the server, not the server's own (it would not bind here)."""
    from grpolab.rollout.vllm.server_client import address_towards

    assert address_towards("127.0.0.1") == "127.0.0.1"
    with socket.socket() as s:
        s.bind((address_towards("127.0.0.1"), 0))  # an address this machine can bind
    with pytest.raises(RolloutServerError, match="GRPOLAB_NCCL_ADDRESS") as err:
        address_towards("no-such-host.invalid")
    assert "\n" not in str(err.value)


def test_the_nccl_source_streams_the_weights_its_metadata_declares():
    """vLLM's NCCL engine sizes the server's receive buffers from ``metadata()`` before it iterates: the
    declared names, dtypes and shapes are the iterated ones, for a plain and a LoRA model, and the tensors
    are taken one at a time (the iterator is not drained ahead)."""
    from peft import LoraConfig, get_peft_model

    from grpolab.rollout.vllm.server_client import StreamSource
    from grpolab.rollout.vllm.sync import policy_weights, weight_metadata
    from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model

    policy = build_tiny_model(build_char_tokenizer(), hidden_size=16, num_layers=1, num_heads=2)
    peft = get_peft_model(build_tiny_model(build_char_tokenizer(), hidden_size=16, num_layers=1, num_heads=2),
                          LoraConfig(r=2, target_modules=["q_proj"]))  # fmt: skip
    for model, merge in ((policy, True), (peft, True), (peft, False)):
        taken = []
        weights = ((taken.append(n) or n, t) for n, t in policy_weights(model, torch.bfloat16, merge_lora=merge))
        source = StreamSource(weights, weight_metadata(model, torch.bfloat16, merge_lora=merge))
        declared = [(m.name, m.dtype, tuple(m.shape)) for m in source.metadata()]
        assert taken == []  # nothing gathered for the metadata
        got = []
        for name, t in source:
            assert taken[-1] == name  # one at a time
            got.append((name, t.dtype, tuple(t.shape)))
        assert got == declared and source.sent == sum(2 * math.prod(s) for _, _, s in declared)
