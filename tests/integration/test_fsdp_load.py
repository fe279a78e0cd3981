"""FSDP2 loading without the unsharded model on every rank (gloo, 2 ranks): rank 0 reads the weights into
host memory, rank 1 builds the model on the meta device (no storage, no file read), both shard, and the
shards are filled from rank 0's broadcast. The policy's, the frozen reference's and PPO's critic's shards,
the buffers (rotary frequencies, not in the state dict) and the log-probs equal those of the plain load,
where every rank reads the whole model onto its device first."""

from __future__ import annotations

import os
import socket

import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _build(cfg, placement: str):
    from grpolab.distributed import parallel
    from grpolab.models.loading import Reference, load_policy

    plain, _ = load_policy(cfg, placement=placement)
    reference = Reference(plain, torch.bfloat16)  # its Linear weights stored in bf16, as under autocast
    full = (plain.state_dict(), reference.frozen_model.state_dict()) if placement == "host" else ({}, {})
    meta = [p.is_meta for p in plain.parameters()]
    reference = parallel.wrap_reference(reference, "fsdp", torch.bfloat16)
    policy = parallel.wrap(plain, "fsdp", torch.device("cpu"), compute_dtype=torch.bfloat16)
    if placement != "device":
        parallel.materialize_from_rank0(policy, full[0], torch.device("cpu"))
        parallel.materialize_from_rank0(reference.frozen_model, full[1], torch.device("cpu"))
    return policy, reference.frozen_model, all(meta)


def _state(model) -> dict:
    out = {f"param:{n}": p.to_local().clone() for n, p in model.named_parameters()}
    out.update({f"buffer:{n}": b.clone() for n, b in model.named_buffers()})
    return out


def _worker(rank: int, port: int, model_dir: str, out: str) -> None:
    from grpolab.config import ModelConfig
    from grpolab.distributed import dist, parallel
    from grpolab.training.logprobs import completion_logprobs

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    cfg = ModelConfig(name_or_path=model_dir, device="cpu", dtype="bfloat16")
    with dist.session("cpu", timeout_s=120.0):
        assert parallel.loads_on_rank0("fsdp") and not parallel.loads_on_rank0("ddp")
        plain_policy, plain_ref, _ = _build(cfg, "device")
        policy, ref, was_meta = _build(cfg, "host" if rank == 0 else "meta")
        states = {"want": (_state(plain_policy), _state(plain_ref)), "got": (_state(policy), _state(ref))}
        prompts, ids = [[5, 6, 7], [8, 9]], torch.tensor([[10, 11, 12], [13, 14, 15]])
        mask = torch.ones_like(ids, dtype=torch.bool)
        with torch.no_grad():
            lp = [completion_logprobs(m, prompts, ids, mask, pad_id=0)[0] for m in (plain_policy, policy, plain_ref, ref)]
        states["critic"] = _critics(model_dir)
        states["lora"] = _lora_policies(model_dir, rank)
        torch.save({**states, "meta": was_meta, "logprobs": lp}, f"{out}.{rank}")


def _lora_policies(model_dir: str, rank: int) -> tuple[dict, dict]:
    """A LoRA policy (PEFT wrapped around the meta model on rank 1) from rank 0's broadcast, and the plain
    load of it with rank 0's adapter initialisation given to every rank."""
    from grpolab.config import LoraConfig, ModelConfig
    from grpolab.distributed import dist, parallel
    from grpolab.models.loading import load_policy

    cfg = ModelConfig(name_or_path=model_dir, device="cpu", lora=LoraConfig(enabled=True, r=4))
    torch.manual_seed(rank)  # each rank's own adapter initialisation: only the broadcast makes them agree
    model, _ = load_policy(cfg, placement="host" if rank == 0 else "meta")
    full = model.state_dict() if rank == 0 else {}
    adapter = {k: v.clone() for k, v in full.items() if "lora_" in k}  # rank 0's first draw
    was_meta = all(p.is_meta for p in model.parameters())
    assert was_meta is (rank == 1)
    policy = parallel.wrap(model, "fsdp", torch.device("cpu"))
    parallel.materialize_from_rank0(policy, full, torch.device("cpu"))
    plain, _ = load_policy(cfg)
    rank0 = dist.broadcast_object(adapter)
    plain.load_state_dict(rank0, strict=False)
    assert sum(p.requires_grad for p in policy.parameters()) == sum(p.requires_grad for p in plain.parameters()) > 0
    return _state(parallel.wrap(plain, "fsdp", torch.device("cpu"))), _state(policy)


def _critics(model_dir: str) -> tuple[dict, dict]:
    """PPO's critic built by build_critic under FSDP2 (rank 0 on the host, rank 1 on meta, then the
    broadcast), and the plain load of it (every rank reads it, then shards)."""
    from grpolab.config import load_config
    from grpolab.distributed import parallel
    from grpolab.runtime.step_spec import build_critic, value_model_spec
    from grpolab.training.spec import LogprobContext
    from grpolab.training.value import load_value_model

    cfg = load_config(None, [f"model.name_or_path={model_dir}", "model.device=cpu", "model.dtype=bfloat16",
                             "algo.name=ppo", "train.parallel=fsdp"])  # fmt: skip
    cpu = torch.device("cpu")
    critic = build_critic(cfg, cpu, LogprobContext(0, 1.0, None, 8, None))
    return _state(parallel.wrap(load_value_model(value_model_spec(cfg), cpu), "fsdp", cpu)), _state(critic.model)


def test_rank0_broadcast_load_equals_every_rank_loading(tiny_model_dir, tmp_path):
    out = str(tmp_path / "state")
    mp.start_processes(_worker, args=(_free_port(), tiny_model_dir, out), nprocs=2, join=True, start_method="spawn")
    for rank in (0, 1):
        r = torch.load(f"{out}.{rank}", weights_only=False)
        assert r["meta"] is (rank == 1)  # rank 1 never held a weight before its shards
        for want, got in zip([*r["want"], r["critic"][0], r["lora"][0]], [*r["got"], r["critic"][1], r["lora"][1]], strict=True):
            assert want.keys() == got.keys()
            for k, v in want.items():
                assert got[k].dtype == v.dtype and torch.equal(got[k], v), (rank, k)
        plain, sharded, plain_ref, ref = r["logprobs"]
        torch.testing.assert_close(sharded, plain, atol=0, rtol=0)
        torch.testing.assert_close(ref, plain_ref, atol=0, rtol=0)
