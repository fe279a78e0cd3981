"""Long completions: peak memory per rank and trained tokens/s of one GRPO step against the sequence length,
in one process (N = 1) and split over two (train.sequence_parallel = 2, DeepSpeed-Ulysses).

The model has Qwen2.5-0.5B's vocabulary (151,936), width (896, MLP 4,864) and heads (14 query, 2 key /
value) but ``--layers`` layers (2), random weights, built in code. One step: one prompt of 32 tokens and G
= 2 completions of exactly ``length`` tokens (rewards 1 and 0, so the advantages are not zero), beta = 0,
mu = 1, AdamW, one completion per micro-batch (a single causal sequence: no mask is built),
gradient checkpointing on (``--checkpointing``). Each (N, length) runs in fresh processes (gloo on a CPU,
NCCL on CUDA), so each peak is its own: on CUDA ``max_memory_allocated``, on a CPU the process's peak RSS
(with the ~0.7 GB of Python, torch and transformers). tokens/s = the step's prompt and completion tokens
over its seconds (every rank trains the same rows; N ranks share them). The gradient norm (the loss reads 0
at mu = 1) is the same for every N, to float tolerance: the split changes where the work runs, not the step.

A length is skipped, with the reason, when its peak predicted from the previous length's (linear in the
length: with checkpointing and flash / memory-efficient attention nothing grows faster) passes
``--limit-gb``; the last lines give, per N, the longest length that fitted. Target (issue 41): N = 2 at
least doubles the longest sequence per rank. TRL's GRPOTrainer refuses sequence parallelism (it is not in
this table).

    nice -n 10 python benchmarks/long_context.py --lengths 4096,8192,16384,32768 --limit-gb 16
    python benchmarks/long_context.py --lengths 128,256 --layers 1 --vocab 4096   # a quick look on a busy CPU
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

SHAPE = {"hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14, "num_key_value_heads": 2,
         "vocab_size": 151_936}  # fmt: skip
PROMPT, G = 32, 2


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="4096,8192,16384,32768", help="completion lengths, comma-separated")
    p.add_argument("--sp", default="1,2", help="train.sequence_parallel values, comma-separated")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=SHAPE["vocab_size"], help="a smaller vocabulary for a quick look")
    p.add_argument("--limit-gb", type=float, default=16.0, help="skip a length predicted to pass this peak per rank")
    p.add_argument("--checkpointing", default="true", choices=("true", "false", "auto"))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return p.parse_args(argv)


def build_model(folder: Path, layers: int, vocab: int) -> None:
    from transformers import AutoModelForCausalLM, Qwen2Config

    from grpolab.tasks.tiny import build_char_tokenizer

    config = Qwen2Config(**{**SHAPE, "vocab_size": vocab}, num_hidden_layers=layers, max_position_embeddings=65_536, tie_word_embeddings=True,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    build_char_tokenizer().save_pretrained(folder)  # only its pad id is read: the completions are made here


def overrides(a, model_dir: Path, length: int, n: int, out: Path) -> list[str]:
    return [
        f"model.name_or_path={model_dir}", f"model.device={a.device}", "model.attn_implementation=sdpa",
        f"model.gradient_checkpointing={a.checkpointing}", "algo.beta=0", "algo.mu=1", "algo.num_minibatches=1",
        f"rollout.num_generations={G}", f"rollout.max_completion_length={length}", "train.prompts_per_step=1",
        "train.micro_batch_size=1", f"train.sequence_parallel={n}", f"train.parallel={'ddp' if n > 1 else 'none'}",
        f"data.max_prompt_length={PROMPT}", f"log.output_dir={out}",
    ]  # fmt: skip


def one_step(cfg) -> dict:
    """One GRPO update on fixed completions of rollout.max_completion_length tokens: seconds, loss, grad norm."""
    from grpolab.distributed import dist, parallel
    from grpolab.models.loading import load_policy, resolve_autocast, resolve_device
    from grpolab.models.ulysses_attention import install
    from grpolab.runtime.step_spec import batch_builder, logprob_context, run_optimizer, update_spec
    from grpolab.training.step import update_policy
    from grpolab.types import Completions

    device = resolve_device(cfg.model)
    amp = resolve_autocast(cfg.model, device)
    model, tok = load_policy(cfg.model, longest_sequence=cfg.longest_sequence)
    install(model, cfg.train.sequence_parallel)
    model = parallel.wrap(model, parallel.resolve_parallel(cfg.train.parallel, dist.world().size), device)
    optimizer, scheduler = run_optimizer(cfg, model)
    gen = torch.Generator().manual_seed(0)
    length = cfg.rollout.max_completion_length
    vocab = _transformers_vocab(model)
    prompt = torch.randint(4, vocab, (PROMPT,), generator=gen).tolist()
    comps = Completions(
        prompt_ids=[prompt] * G, completion_ids=torch.randint(4, vocab, (G, length), generator=gen).to(device),
        completion_mask=torch.ones(G, length, dtype=torch.bool, device=device),
        logprobs=torch.zeros(G, length, device=device), texts=[""] * G,
        finish_reasons=["length"] * G, num_generations=G,
    )  # fmt: skip
    rewards, valid = torch.tensor([[1.0, 0.0]]), torch.ones(1, G, dtype=torch.bool)
    ctx = logprob_context(cfg, pad_id=tok.pad_token_id, autocast_dtype=amp, device_type=device.type)
    batch, _ = batch_builder(cfg, ctx, None)(comps, [prompt], rewards, valid, policy=model, reference=None)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = update_policy(model, optimizer, scheduler, batch, update_spec(cfg, ctx), generator=torch.Generator().manual_seed(1))
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak_mb = (torch.cuda.max_memory_allocated() if device.type == "cuda" else _peak_rss()) / 2**20
    return {"seconds": seconds, "loss": out["loss"], "grad_norm": out["grad_norm"], "peak_mb": peak_mb}


def _transformers_vocab(model) -> int:
    from grpolab.distributed.parallel import unwrap

    return unwrap(model).config.vocab_size


def _peak_rss() -> float:
    from common import peak_rss_mb  # this process's own peak (VmHWM), not the parent's carried by ru_maxrss

    return peak_rss_mb() * 2**20


def _rank(rank: int, world: int, port: int, args: list[str], result: str) -> None:
    if world > 1:  # one process runs without a process group, as a plain run does
        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                           "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)})  # fmt: skip
    from grpolab.config import load_config
    from grpolab.distributed import dist, sequence
    from grpolab.models.loading import resolve_device

    cfg = load_config(None, args)
    with dist.session(resolve_device(cfg.model).type), sequence.sequence_parallel(cfg.train.sequence_parallel):
        got = one_step(cfg)
        peak = dist.all_reduce_max(got["peak_mb"])  # the largest rank's: the figure a device must hold
        if dist.is_main():
            Path(result).write_text(json.dumps({**got, "peak_mb": peak}))


def measure(a, model_dir: Path, length: int, n: int, out: Path) -> dict:
    """One step of ``length`` tokens over ``n`` fresh processes; its row."""
    result = out / f"n{n}_{length}.json"
    mp.start_processes(_rank, args=(n, _free_port(), overrides(a, model_dir, length, n, out), str(result)), nprocs=n,
                       join=True, start_method="spawn")  # fmt: skip
    got = json.loads(result.read_text())
    return {**got, "n": n, "length": length, "tokens_per_s": G * (PROMPT + length) / got["seconds"]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    a = parse(argv)
    lengths, sizes = [int(x) for x in a.lengths.split(",")], [int(x) for x in a.sp.split(",")]
    limit_mb = a.limit_gb * 1024
    rows, longest = [], {}
    with tempfile.TemporaryDirectory(prefix="long_context_") as tmp:
        model_dir = Path(tmp) / "model"
        build_model(model_dir, a.layers, a.vocab)
        for n in sizes:
            last = None
            for length in lengths:
                if last is not None and last["peak_mb"] * length / last["length"] > limit_mb:
                    rows.append(f"| {n} | {length:,} | skipped: predicted past {a.limit_gb} GB | - | - |")
                    continue
                last = measure(a, model_dir, length, n, Path(tmp))
                fits = last["peak_mb"] <= limit_mb
                longest[n] = length if fits else longest.get(n, 0)
                rows.append(f"| {n} | {length:,} | {last['peak_mb']:,.0f}{'' if fits else ' (over)'} | "
                            f"{last['tokens_per_s']:,.0f} | {last['grad_norm']:.4e} |")  # fmt: skip
                print(rows[-1], file=sys.stderr, flush=True)
    print(f"{a.device}, torch {torch.__version__}; Qwen2.5-0.5B shape with {a.layers} layers; {G} completions of "
          f"each length after a {PROMPT}-token prompt; checkpointing={a.checkpointing}\n")  # fmt: skip
    print("| train.sequence_parallel | completion tokens | peak MB per rank | tokens/s | grad norm |\n|---|---|---|---|---|")
    print("\n".join(rows))
    for n in sizes:
        print(f"longest completion within {a.limit_gb} GB per rank, N = {n}: {longest.get(n, 0):,} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
