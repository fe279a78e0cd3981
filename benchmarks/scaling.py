"""World size 1 against 2 on the same global batch: steps/s, completions/s, share of step time in collectives.

Runs the real training loop (``grpolab.train``) on the tiny model of the demo, once in one process and
once as a 2-process gloo job (torch.multiprocessing, one thread per process), with the same global
batch (train.prompts_per_step prompts x rollout.num_generations completions). Step times come from
metrics.jsonl (``sys/step_time_s``, the first step left out as warm-up); collective time from the
torch profiler (CPU events of c10d / gloo collectives, including DDP's gradient all-reduce waits) on
rank 0, over the whole run, divided by the summed step times. On a shared CPU the figures are noisy:
compare the ratio printed on the same run, not numbers across machines.

    python benchmarks/scaling.py [--steps 6] [--parallel ddp|fsdp]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp

COLLECTIVE_MARKERS = ("c10d", "gloo", "allreduce", "all_reduce", "allgather", "all_gather", "broadcast",
                      "reduce_scatter", "barrier")  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _overrides(model_dir: str, data: str, out: str, name: str, args) -> list[str]:
    return [
        f"model.name_or_path={model_dir}", f"data.path={data}", "reward.functions=[{name: exact_match}]",
        f"rollout.num_generations={args.generations}", f"rollout.max_completion_length={args.length}",
        f"train.prompts_per_step={args.prompts}", f"train.num_steps={args.steps}", f"train.parallel={args.parallel}",
        "train.micro_batch_size=8", "optim.lr=1e-4", f"log.output_dir={out}", f"log.run_name={name}",
        "log.checkpoint_every=0", "log.progress=false", "log.keep_last=1",
    ]  # fmt: skip


def _rank(rank: int, world: int, port: int, overrides: list[str], result: str) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)})  # fmt: skip
    torch.set_num_threads(1)
    from torch.profiler import ProfilerActivity, profile

    from grpolab.config import load_config
    from grpolab.commands.train import train

    cfg = load_config(None, overrides)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        train(cfg)
    if rank == 0:
        events = prof.key_averages()
        coll = sum(e.cpu_time_total for e in events if any(m in e.key.lower() for m in COLLECTIVE_MARKERS))
        Path(result).write_text(json.dumps({"collective_s": coll / 1e6}))


def run(world: int, model_dir: str, data: str, out: str, args) -> dict[str, float]:
    name = f"world{world}"
    result = str(Path(out) / f"{name}.json")
    if world > 1:
        mp.start_processes(_rank, args=(world, _free_port(), _overrides(model_dir, data, out, name, args), result),
                           nprocs=world, join=True, start_method="spawn")  # fmt: skip
    else:
        ctx = mp.get_context("spawn")
        p = ctx.Process(target=_rank, args=(0, 1, _free_port(), _overrides(model_dir, data, out, name, args), result))
        p.start()
        p.join()
    rows = [json.loads(x) for x in (Path(out) / name / "metrics.jsonl").read_text().splitlines()]
    step_s = sum(r["sys/step_time_s"] for r in rows[1:])
    measured = len(rows) - 1
    coll = json.loads(Path(result).read_text())["collective_s"]
    completions = args.prompts * args.generations
    return {
        "world": world,
        "steps_per_s": measured / step_s,
        "completions_per_s": measured * completions / step_s,
        "collective_frac": coll / step_s,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--length", type=int, default=16)
    p.add_argument("--parallel", default="ddp", choices=["ddp", "fsdp"])
    args = p.parse_args()
    from grpolab.tasks.arithmetic import arithmetic_examples
    from grpolab.tasks.tiny import save_tiny

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_tiny(Path(tmp) / "model", hidden_size=128, num_layers=4, num_heads=4)
        data = Path(tmp) / "data.jsonl"
        rows = arithmetic_examples(size=64, seed=0, digits=2)
        data.write_text("".join(json.dumps({"prompt": e.prompt, "answer": e.answer}) + "\n" for e in rows))
        one = run(1, model_dir, str(data), tmp, argparse.Namespace(**{**vars(args), "parallel": "none"}))
        two = run(2, model_dir, str(data), tmp, args)
    print(f"global batch: {args.prompts} prompts x {args.generations} completions, {args.steps} steps "
          f"(first left out), 1 thread per process, train.parallel={args.parallel} for world 2")  # fmt: skip
    print(f"{'world':>5} {'steps/s':>8} {'compl/s':>8} {'in collectives':>15}")
    for r in (one, two):
        print(f"{r['world']:>5} {r['steps_per_s']:>8.3f} {r['completions_per_s']:>8.1f} {r['collective_frac']:>14.1%}")
    print(f"speed-up world 2 / world 1: {two['steps_per_s'] / one['steps_per_s']:.2f}x")


if __name__ == "__main__":
    main()
