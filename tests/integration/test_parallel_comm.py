"""What the data-parallel wrappers send (gloo, 2 ranks): DDP all-reduces once per optimizer step, not per
micro-batch (also through update_policy), and its gradients equal the every-micro-batch ones; FSDP2 under bf16 autocast all-gathers
bf16 (the whole model gathered for sampling is bf16) while its sharded master parameters stay fp32, and
gathering it for sampling leaves the root unit gathered from its forward to its backward, as FSDP2 sets it."""

from __future__ import annotations

import os
import socket

import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_grads(model, rank: int, *, defer: bool) -> tuple[dict[str, torch.Tensor], int]:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    from grpolab.distributed.parallel import gradient_sync

    ddp = DistributedDataParallel(model)
    calls = []

    def counting(state, bucket):
        calls.append(1)
        return allreduce_hook(None, bucket)

    ddp.register_comm_hook(None, counting)
    ddp.zero_grad(set_to_none=True)
    for i in range(3):  # three micro-batches of one optimizer step
        ids = torch.randint(4, 60, (2, 6), generator=torch.Generator().manual_seed(10 * rank + i))
        with gradient_sync(ddp, sync=not defer or i == 2):
            ddp(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, len(calls)


def _worker(rank: int, port: int, out: str) -> None:
    import copy

    from grpolab.distributed import dist
    from grpolab.distributed.parallel import fsdp_param_dtype, gathered, shard_fsdp
    from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    with dist.session("cpu", timeout_s=120.0):
        model = build_tiny_model(build_char_tokenizer(), hidden_size=32, num_layers=2, num_heads=2)
        every, every_calls = _ddp_grads(copy.deepcopy(model), rank, defer=False)
        once, once_calls = _ddp_grads(copy.deepcopy(model), rank, defer=True)
        dtype = fsdp_param_dtype("float32", torch.bfloat16)
        sharded = shard_fsdp(copy.deepcopy(model), compute_dtype=dtype)
        stored = {p.dtype for p in sharded.parameters()}
        root_before = _root_kept_after_forward(sharded)
        with gathered(sharded) as whole:
            sampled = {p.dtype for p in whole.parameters()}
        root_after = _root_kept_after_forward(sharded)
        from grpolab.rollout.vllm.sync import policy_weights, weight_metadata

        declared = weight_metadata(sharded, torch.bfloat16)  # from the shards: nothing gathered
        gathered_meta = [(n, t.dtype, tuple(t.shape)) for n, t in policy_weights(sharded, torch.bfloat16)]
        step_calls = _update_policy_calls(copy.deepcopy(model), rank)
        if rank == 0:
            torch.save({"every": (every, every_calls), "once": (once, once_calls), "dtypes": (dtype, stored, sampled),
                        "step": step_calls, "root": (root_before, root_after),
                        "meta": (declared, gathered_meta)}, out)  # fmt: skip


def _root_kept_after_forward(model) -> bool:
    """Whether FSDP2's root unit (embeddings, norm, head) stays gathered from its forward to its backward,
    FSDP2's own choice for the root (it would be gathered again at once for the backward)."""
    from torch.distributed.tensor import DTensor

    ids = torch.randint(4, 60, (2, 6), generator=torch.Generator().manual_seed(0))
    loss = model(input_ids=ids).logits.float().logsumexp(-1).mean()
    kept = not isinstance(model.model.embed_tokens.weight, DTensor)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return kept


def _update_policy_calls(model, rank: int) -> int:
    """All-reduce calls of one update_policy: 2 minibatches (optimizer steps) of 3 one-row micro-batches."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    from grpolab.config import Config, OptimConfig, RolloutConfig, TrainConfig, preset_algo
    from grpolab.runtime.step_spec import logprob_context, update_spec
    from grpolab.training.step import update_policy
    from grpolab.types import RolloutBatch

    ddp, calls = DistributedDataParallel(model), []
    ddp.register_comm_hook(None, lambda state, bucket: calls.append(1) or allreduce_hook(None, bucket))
    cfg = Config(optim=OptimConfig(lr=0.1), algo=preset_algo(num_minibatches=2), rollout=RolloutConfig(num_generations=3),
                 train=TrainConfig(prompts_per_step=2, micro_batch_size=1))  # fmt: skip
    gen = torch.Generator().manual_seed(rank)
    ids = torch.randint(4, 60, (6, 5), generator=gen)
    mask = torch.ones(6, 5, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.2, -0.2])[:, None] * mask
    old = -torch.rand(6, 5, generator=gen)
    batch = RolloutBatch([[5, 6]] * 6, ids, mask, mask, adv, old_logprobs=old, ref_logprobs=old - 0.1)
    sgd = torch.optim.SGD(ddp.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(sgd, lambda s: 1.0)
    spec = update_spec(cfg, logprob_context(cfg, pad_id=0, autocast_dtype=None, device_type="cpu"))
    metrics = update_policy(ddp, sgd, sched, batch, spec, generator=torch.Generator().manual_seed(0))
    assert metrics["grad_norm"] > 0 and metrics["train/skipped_updates"] == 0
    return len(calls)


def test_ddp_reduces_once_per_step_and_fsdp_gathers_bf16(tmp_path):
    out = str(tmp_path / "comm.pt")
    mp.start_processes(_worker, args=(_free_port(), out), nprocs=2, join=True, start_method="spawn")
    r = torch.load(out, weights_only=False)
    (every, every_calls), (once, once_calls) = r["every"], r["once"]
    assert every_calls == 3 * once_calls and once_calls >= 1  # each bucket once per step, not per micro-batch
    for name, g in every.items():
        torch.testing.assert_close(once[name], g, atol=1e-6, rtol=1e-5, msg=name)
    assert r["step"] == 2 * once_calls  # 2 optimizer steps of 3 micro-batches each: 6 backwards, 2 all-reduces
    dtype, stored, sampled = r["dtypes"]
    assert dtype == torch.bfloat16 and stored == {torch.float32} and sampled == {torch.bfloat16}
    declared, gathered_meta = r["meta"]
    assert declared == gathered_meta and len(declared) > 3  # the NCCL source's metadata: the whole shapes
    assert r["root"] == (True, True)  # gathering for sampling leaves the root's no-reshard as FSDP2 set it
    from grpolab.distributed.parallel import fsdp_param_dtype

    assert fsdp_param_dtype("float32", None) is None  # full precision stays full precision
    assert fsdp_param_dtype("bfloat16", None) is torch.bfloat16
