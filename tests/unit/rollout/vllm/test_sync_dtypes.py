"""Weights go to the engine in the dtypes it holds them in, cast on the trainer's side (rollout/vllm/sync.py):
a bf16 engine gets half an fp32 trainer's bytes, a parameter it keeps in fp32 stays fp32, and the byte counts
the samplers report are those of the tensors sent. No vLLM needed: the server's side is a recording fake."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpolab.rollout.vllm import shm
from grpolab.rollout.vllm.server_client import adapter_state
from grpolab.rollout.vllm.sync import EngineDtypes, Tally, held_dtypes, policy_weights, weight_metadata
from grpolab.rollout.vllm.weights import WeightSender
from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model

NORM = "model.layers.0.input_layernorm.weight"


@pytest.fixture
def policy():
    """fp32, 1 layer, hidden 16, tied head: every tensor's element count is known from its shape."""
    return build_tiny_model(build_char_tokenizer(), hidden_size=16, num_layers=1, num_heads=2)


def elements(model) -> int:
    """The elements a sync sends: every parameter, the tied head under both names."""
    return sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))


def test_a_bf16_engine_gets_bf16_tensors_and_half_the_bytes(policy):
    fp32 = Tally(policy_weights(policy, torch.float32))
    bf16 = Tally(policy_weights(policy, EngineDtypes(torch.bfloat16)))
    sent32, sent16 = dict(fp32), dict(bf16)
    assert {t.dtype for t in sent16.values()} == {torch.bfloat16}
    assert {t.dtype for t in sent32.values()} == {torch.float32}
    n = elements(policy)
    assert fp32.bytes == 4 * n and bf16.bytes == 2 * n  # halved
    for name, t in sent16.items():  # the same values, rounded once
        assert torch.equal(t, sent32[name].to(torch.bfloat16)), name
    assert next(policy.parameters()).dtype == torch.float32  # the trainer's weights are left as they were


def test_a_parameter_the_engine_keeps_in_fp32_is_sent_in_fp32(policy):
    dtypes = EngineDtypes(torch.bfloat16, {NORM: torch.float32})
    sent = dict(policy_weights(policy, dtypes))
    assert sent[NORM].dtype == torch.float32 and torch.equal(sent[NORM], policy.model.layers[0].input_layernorm.weight)
    assert {t.dtype for n, t in sent.items() if n != NORM} == {torch.bfloat16}
    declared = {name: dtype for name, dtype, _ in weight_metadata(policy, dtypes)}  # the nccl engine's buffers alike
    assert declared == {n: t.dtype for n, t in sent.items()}


def test_the_parameters_an_engine_holds_in_another_dtype_by_checkpoint_name():
    """vLLM fuses q/k/v into ``qkv_proj`` (its ``packed_modules_mapping``): an fp32 fused weight is held for
    each checkpoint name it is loaded from; parameters in the model dtype are not listed."""

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv_proj = torch.nn.Linear(2, 6, bias=False, dtype=torch.float32)
            self.o_proj = torch.nn.Linear(2, 2, bias=False, dtype=torch.bfloat16)

    class Engine(torch.nn.Module):
        packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}

        def __init__(self):
            super().__init__()
            self.attn = Attn()
            self.scale = torch.nn.Parameter(torch.ones(1, dtype=torch.float32))

    assert held_dtypes(Engine(), torch.bfloat16) == {
        "attn.q_proj.weight": torch.float32,
        "attn.k_proj.weight": torch.float32,
        "attn.v_proj.weight": torch.float32,
        "scale": torch.float32,
    }
    assert held_dtypes(Engine(), torch.float32) == {"attn.o_proj.weight": torch.bfloat16}


class RecordingServer:
    """The calls a WeightSender makes, answered as a vLLM server with grpolab's shm engine answers them;
    what each bucket file and adapter folder held is read when it is posted (the sender deletes them)."""

    def __init__(self):
        self.url, self.server, self.served = "http://fake", None, None
        self.buckets: list[dict] = []
        self.adapters: list[dict[str, torch.Tensor]] = []

    def call(self, method, path, body=None):
        if path == "/update_weights":
            info = body["update_info"]
            tensors = shm.read_bucket(info, Path(info["path"]).parent)
            self.buckets.append({"info": info, "dtypes": {t.dtype for _, t in tensors}})
        elif path == "/v1/load_lora_adapter":
            from safetensors.torch import load_file

            self.adapters.append(load_file(str(Path(body["lora_path"]) / "adapter_model.safetensors")))
        elif path in ("/finish_weight_update", "/update_weight_version"):
            self.served = body.get("weight_version") or body.get("new_version")

    def version(self):
        return self.served


def test_the_shm_transport_sends_bf16_buckets_and_counts_their_bytes(policy):
    server = RecordingServer()
    sender = WeightSender(server, transport="shm", bucket_bytes=4096, dtype=torch.bfloat16, lora=False)
    try:
        sent = sender.send(policy, 0, reports_loaded=False)
    finally:
        sender.close()
    assert len(server.buckets) > 1 and all(b["dtypes"] == {torch.bfloat16} for b in server.buckets)
    assert all(b["info"]["dtype_names"] == ["bfloat16"] * len(b["info"]["names"]) for b in server.buckets)
    assert sent == 2 * elements(policy)  # the tensors' bytes, half of fp32's; the 64-byte alignment not counted


def test_lora_sends_the_base_once_and_the_adapter_in_the_servers_dtype(policy):
    from peft import LoraConfig, get_peft_model

    peft = get_peft_model(policy, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    adapter = adapter_state(peft)
    assert {v.dtype for v in adapter.values()} == {torch.float32}
    server = RecordingServer()
    sender = WeightSender(server, transport="shm", bucket_bytes=2**20, dtype=torch.bfloat16, lora=True)
    try:
        first = sender.send(peft, 0, reports_loaded=False)
        second = sender.send(peft, 1, reports_loaded=False)
    finally:
        sender.close()
    base = sum(p.numel() for n, p in peft.get_base_model().named_parameters(remove_duplicate=False) if "lora_" not in n)
    lora = sum(v.numel() for v in adapter.values())  # q_proj and v_proj of 1 layer, each A 2x16 + B 16x2: 128
    assert lora == 128
    assert first == 2 * (base + lora) and second == 2 * lora  # the base only at the first sync; bf16 bytes
    assert all(b["dtypes"] == {torch.bfloat16} for b in server.buckets)
    assert len(server.adapters) == 2
    for got in server.adapters:
        assert set(got) == set(adapter)
        for k, v in got.items():
            assert v.dtype == torch.bfloat16 and torch.equal(v, adapter[k].to(torch.bfloat16)), k
