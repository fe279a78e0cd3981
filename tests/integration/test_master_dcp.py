"""torchrun + DDP + bf16 weights: the fp32 master-weight optimizer goes through a DCP checkpoint.

Two gloo ranks train a bf16 tiny model under DDP with MasterWeightOptimizer (fp32 masters, AdamW), write
a sharded checkpoint (runtime/sharded.py) after 2 steps and go on to step 4. A fresh model with other
weights and a fresh optimizer then load that checkpoint and run steps 3 and 4 again: weights, masters and
AdamW states must equal the uninterrupted run's. DCP's own get_optimizer_state_dict cannot name the
masters (they are no parameters of the model), which crashed the first checkpoint and every resume.
"""

from __future__ import annotations

import os
import socket

import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(ddp, opt, sched, steps, rank: int) -> list[float]:
    from grpolab.training.master import backward, grads_to_clip

    losses = []
    for i in steps:
        gen = torch.Generator().manual_seed(100 * i + rank)  # each rank its own data, each step its own
        ids = torch.randint(4, 60, (2, 7), generator=gen)
        opt.zero_grad(set_to_none=True)
        logits = ddp(input_ids=ids).logits.float()
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        backward(loss, opt)
        torch.nn.utils.clip_grad_norm_(grads_to_clip(ddp, opt), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


def _worker(rank: int, port: int, tmp: str) -> None:
    from pathlib import Path

    from torch.nn.parallel import DistributedDataParallel

    from grpolab.config import OptimConfig
    from grpolab.distributed import dist
    from grpolab.runtime import sharded
    from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model
    from grpolab.training.master import MasterWeightOptimizer
    from grpolab.training.optim import build_optimizer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    optim = OptimConfig(lr=1e-2, weight_decay=0.01)
    tok = build_char_tokenizer()

    def fresh(seed: int):
        model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2, seed=seed).to(torch.bfloat16)
        ddp = DistributedDataParallel(model)
        opt, sched = build_optimizer(ddp, optim, total_steps=10)
        assert isinstance(opt, MasterWeightOptimizer)
        return model, ddp, opt, sched

    with dist.session("cpu", timeout_s=120.0):
        model, ddp, opt, sched = fresh(0)
        _train(ddp, opt, sched, [0, 1], rank)
        parts = {"models": {"model": ddp}, "optimizers": {"optimizer": (ddp, opt)}}
        path = sharded.save(Path(tmp), 2, **parts, state={"scheduler": sched.state_dict()}, tokenizer=tok, keep_last=2)
        want_losses = _train(ddp, opt, sched, [2, 3], rank)

        model2, ddp2, opt2, sched2 = fresh(1)  # other weights: the load must replace them all
        state = sharded.load(path, models={"model": ddp2}, optimizers={"optimizer": (ddp2, opt2)})
        sched2.load_state_dict(state["scheduler"])
        got_losses = _train(ddp2, opt2, sched2, [2, 3], rank)
        if rank == 0:
            torch.save({
                "losses": (want_losses, got_losses),
                "weights": (model.state_dict(), model2.state_dict()),
                "masters": (opt.masters, opt2.masters),
                "adam": ([opt.optimizer.state[m]["exp_avg_sq"] for m in opt.masters],
                         [opt2.optimizer.state[m]["exp_avg_sq"] for m in opt2.masters]),
                "steps": ([float(opt.optimizer.state[m]["step"]) for m in opt.masters],
                          [float(opt2.optimizer.state[m]["step"]) for m in opt2.masters]),
                "lr": (opt.param_groups[0]["lr"], opt2.param_groups[0]["lr"]),
            }, Path(tmp) / "result.pt")  # fmt: skip


def test_ddp_bf16_masters_checkpoint_and_resume_equal_the_uninterrupted_run(tmp_path):
    mp.start_processes(_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    r = torch.load(tmp_path / "result.pt", weights_only=False)
    want, got = r["losses"]
    assert all(torch.isfinite(torch.tensor(want)))
    for a, b in zip(want, got, strict=True):
        assert abs(a - b) <= 1e-6 * max(1.0, abs(a))
    weights, resumed = r["weights"]
    assert all(v.dtype == torch.bfloat16 for v in resumed.values())
    for k, v in weights.items():
        torch.testing.assert_close(resumed[k], v, atol=0, rtol=0, msg=k)  # bf16: the same rounding of equal masters
    for a, b in zip(*r["masters"], strict=True):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(b, a, atol=1e-7, rtol=1e-6)
    for a, b in zip(*r["adam"], strict=True):
        torch.testing.assert_close(b, a, atol=1e-9, rtol=1e-6)
    assert r["steps"][0] == r["steps"][1] == [4.0] * len(r["steps"][0])  # 2 saved + 2 after the resume
    assert r["lr"][0] == r["lr"][1] == 1e-2
