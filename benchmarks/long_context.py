"""Long completions: peak memory per rank and trained tokens/s of one GRPO step against the sequence length,
grpolab in one process (N = 1) and split over two (train.sequence_parallel = 2, DeepSpeed-Ulysses), and TRL's
GRPOTrainer in one process; and the longest length each trains within a memory limit per rank.

The model has Qwen2.5-0.5B's vocabulary (151,936), width (896, MLP 4,864) and heads (14 query, 2 key / value)
but ``--layers`` layers (2), random weights, fp32, built in code. One step: one prompt of 32 tokens and G = 2
completions of exactly ``length`` tokens, fixed in advance (rewards 1 and 0, so the advantages are not zero),
beta = 0, mu = 1, AdamW, one completion per micro-batch, gradient checkpointing on (``--checkpointing``); the
N = 2 runs under DDP (``--parallel``: each rank holds the whole model, its gradients, DDP's gradient buckets
and AdamW's state, ~0.5 GB more per rank than one process at this shape; fsdp shards them).
grpolab's step is the batch's forwards and the update (no generation); TRL's is one ``GRPOTrainer`` step whose
``rollout_func`` hands it the same fixed completions (no generation either), per_device_train_batch_size 1 and
gradient accumulation over the G completions. TRL's trainer has no sequence parallelism on a CPU (its context
parallelism needs accelerate's FSDP2 on GPUs), so it runs with N = 1 only; ``--no-trl`` leaves it out.

Each (kind, N, length) runs in fresh processes (N = 2 under torchrun, gloo on a CPU, NCCL on CUDA) under a
watchdog (watchdog.py) that polls every rank's resident memory (VmRSS of its process tree) and kills the job
the moment a rank passes ``--memory-limit-mb`` ("out of memory at L tokens"; the longer lengths of that kind
and N are then skipped) or the machine's available memory falls below ``--keep-free-mb``, so no length can
take the machine down. Peak per rank: on CUDA ``max_memory_allocated``, on a CPU the largest rank's own VmHWM
(with the ~0.7 GB of Python, torch and transformers). tokens/s = the step's prompt and completion tokens over
its seconds (N ranks share them), one thread per rank (``--threads``). grpolab's gradient norm is the same
for every N, to float tolerance: the split changes where the work runs, not the step.

The full measurement (the issue's; on a quiet machine: it needs ~3 x --memory-limit-mb free; ~1 h on 2 cores):

    nice -n 10 python benchmarks/long_context.py --lengths 4096,8192,16384,32768 --memory-limit-mb 16000

Target (issue 41): N = 2 at least doubles the longest trainable length per rank, and grpolab trains 32K on the
0.5B shape where TRL runs out. A quick look on a busy CPU:

    nice -n 10 python benchmarks/long_context.py --lengths 512,1024 --layers 1 --memory-limit-mb 3000
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
from watchdog import run_watched

SHAPE = {"hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14, "num_key_value_heads": 2,
         "vocab_size": 151_936}  # fmt: skip
PROMPT, G = 32, 2


class OutOfMemory(RuntimeError):
    """The watchdog killed a measurement (its message says why)."""


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="4096,8192,16384,32768", help="completion lengths, comma-separated")
    p.add_argument("--sp", default="1,2", help="grpolab's train.sequence_parallel values, comma-separated")
    p.add_argument("--no-trl", action="store_true", help="leave TRL's GRPOTrainer out")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=SHAPE["vocab_size"], help="a smaller vocabulary for a quick look")
    p.add_argument("--memory-limit-mb", type=float, default=16000.0, help="resident memory one rank may hold")
    p.add_argument("--keep-free-mb", type=float, default=2048.0, help="stop a run when the machine has less available")
    p.add_argument("--parallel", default="ddp", choices=("ddp", "fsdp"), help="train.parallel of the N > 1 runs")
    p.add_argument("--checkpointing", default="true", choices=("true", "false", "auto"))
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--child", choices=("grpolab", "trl"), help=argparse.SUPPRESS)  # a measurement's process
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)
    p.add_argument("--overrides", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
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
        "train.micro_batch_size=1", f"train.sequence_parallel={n}", f"train.parallel={getattr(a, 'parallel', 'ddp') if n > 1 else 'none'}",
        f"data.max_prompt_length={PROMPT}", f"log.output_dir={out}", *(["model.autocast=none"] if a.device == "cpu" else []),
    ]  # fmt: skip


def fixed_work(vocab: int, length: int) -> tuple[list[int], torch.Tensor]:
    """The step's prompt [PROMPT] and completions [G, length]: random token ids, the same for every kind."""
    gen = torch.Generator().manual_seed(0)
    return torch.randint(4, vocab, (PROMPT,), generator=gen).tolist(), torch.randint(4, vocab, (G, length), generator=gen)


def one_step(cfg) -> dict:
    """One GRPO step on fixed completions of rollout.max_completion_length tokens (the batch's forwards and the
    update): seconds, loss, grad norm, peak MB."""
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
    length = cfg.rollout.max_completion_length
    prompt, ids = fixed_work(parallel.unwrap(model).config.vocab_size, length)
    comps = Completions(
        prompt_ids=[prompt] * G, completion_ids=ids.to(device),
        completion_mask=torch.ones(G, length, dtype=torch.bool, device=device),
        logprobs=torch.zeros(G, length, device=device), texts=[""] * G,
        finish_reasons=["length"] * G, num_generations=G,
    )  # fmt: skip
    rewards, valid = torch.tensor([[1.0, 0.0]]), torch.ones(1, G, dtype=torch.bool)
    ctx = logprob_context(cfg, pad_id=tok.pad_token_id, autocast_dtype=amp, device_type=device.type)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    batch, _ = batch_builder(cfg, ctx, None)(comps, [prompt], rewards, valid, policy=model, reference=None)
    out = update_policy(model, optimizer, scheduler, batch, update_spec(cfg, ctx), generator=torch.Generator().manual_seed(1))
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "loss": out["loss"], "grad_norm": out["grad_norm"], "peak_mb": _peak_mb(device)}


def trl_step(model_dir: str, length: int, checkpointing: bool, device: str, out: Path) -> dict:
    """One TRL GRPOTrainer step on the same fixed completions (its ``rollout_func``): seconds, loss, grad norm.
    ``out``: the trainer's output_dir (it saves nothing there)."""
    import warnings

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    warnings.filterwarnings("ignore")
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    prompt, ids = fixed_work(model.config.vocab_size, length)

    def rollout(prompts, trainer):  # each prompt comes G times (TRL's RepeatSampler): one completion each
        rows = [ids[i % G].tolist() for i in range(len(prompts))]
        return {"prompt_ids": [prompt] * len(prompts), "completion_ids": rows, "logprobs": [[0.0] * length for _ in rows]}

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.seconds = time.perf_counter() - self.t0

    args = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=1,
        gradient_accumulation_steps=G, num_generations=G, max_completion_length=length, beta=0.0, num_iterations=1,
        learning_rate=1e-6, max_steps=1, bf16=False, use_cpu=device == "cpu", report_to="none", save_strategy="no",
        logging_steps=1, seed=0, gradient_checkpointing=checkpointing, dataloader_num_workers=0,
    )  # fmt: skip
    timer = Timer()
    trainer = GRPOTrainer(
        model=model, reward_funcs=lambda completions, **_: [float(i % 2 == 0) for i in range(len(completions))],
        args=args, train_dataset=Dataset.from_list([{"prompt": "x"}] * G), processing_class=tok, rollout_func=rollout,
        callbacks=[timer],
    )  # fmt: skip
    trainer.train()
    logged = next(row for row in trainer.state.log_history if "grad_norm" in row)
    return {"seconds": timer.seconds, "loss": logged.get("loss", float("nan")), "grad_norm": logged["grad_norm"],
            "peak_mb": _peak_mb(torch.device(device))}  # fmt: skip


def _peak_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    from common import peak_rss_mb  # this process's own peak (VmHWM), not the parent's carried by ru_maxrss

    return peak_rss_mb()


def child(a) -> None:
    """A measurement's process: grpolab's step (a rank of the job under torchrun) or TRL's; the result file."""
    torch.set_num_threads(a.threads)
    if a.child == "trl":
        got = trl_step(a.model, a.length, a.checkpointing != "false", a.device, Path(a.result).with_suffix(".trl"))
        Path(a.result).write_text(json.dumps(got))
        return
    from grpolab.config import load_config
    from grpolab.distributed import dist, sequence
    from grpolab.models.loading import resolve_device

    cfg = load_config(None, json.loads(a.overrides))
    with dist.session(resolve_device(cfg.model).type), sequence.sequence_parallel(cfg.train.sequence_parallel):
        got = one_step(cfg)
        peak = dist.all_reduce_max(got["peak_mb"])  # the largest rank's: the figure a device must hold
        if dist.is_main():
            Path(a.result).write_text(json.dumps({**got, "peak_mb": peak}))


def measure(a, model_dir: Path, length: int, n: int, out: Path, kind: str = "grpolab") -> dict:
    """One step of ``length`` tokens over ``n`` fresh processes under the watchdog; its row. OutOfMemory when
    the watchdog killed it, RuntimeError when it failed."""
    result, log = out / f"{kind}_n{n}_{length}.json", out / f"{kind}_n{n}_{length}.log"
    me = [__file__, "--child", kind, "--model", str(model_dir), "--length", str(length), "--result", str(result),
          "--device", a.device, "--checkpointing", a.checkpointing, "--threads", str(getattr(a, "threads", 1)),
          "--overrides", json.dumps(overrides(a, model_dir, length, n, out))]  # fmt: skip
    launch = [sys.executable, *me]
    if n > 1:
        launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n), "--master_addr", "127.0.0.1",
                  "--master_port", str(_free_port()), *me]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(getattr(a, "threads", 1)), "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # fmt: skip
    watched = run_watched(launch, env=env, torchrun=n > 1, limit_mb=getattr(a, "memory_limit_mb", None),
                          keep_free_mb=getattr(a, "keep_free_mb", 1024.0), log=log)  # fmt: skip
    if watched.killed:
        raise OutOfMemory(f"out of memory at {length:,} tokens ({watched.killed})")
    if watched.returncode != 0 or not result.exists():
        raise RuntimeError(f"{kind} N={n} at {length:,} tokens exited {watched.returncode}: {log.read_text()[-2000:]}")
    got = json.loads(result.read_text())
    return {**got, "n": n, "length": length, "tokens_per_s": G * (PROMPT + length) / got["seconds"]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    a = parse(argv)
    if a.child:
        child(a)
        return 0
    lengths = [int(x) for x in a.lengths.split(",")]
    runs = [("grpolab", int(n)) for n in a.sp.split(",")]
    trl_note = "TRL: left out (--no-trl)" if a.no_trl else "TRL: not installed (pip install 'grpolab[bench]')"
    if not a.no_trl and importlib.util.find_spec("trl") is not None:
        runs.append(("trl", 1))
        trl_note = f"TRL {__import__('trl').__version__}: GRPOTrainer, N = 1 (no sequence parallelism on a CPU)"
    rows, longest = [], {}
    with tempfile.TemporaryDirectory(prefix="long_context_") as tmp:
        model_dir = Path(tmp) / "model"
        build_model(model_dir, a.layers, a.vocab)
        for kind, n in runs:
            ran_out = None
            for length in lengths:
                rows.append(row(a, kind, n, length, model_dir, Path(tmp), ran_out, longest))
                ran_out = ran_out or (length if "out of memory" in rows[-1] else None)
                print(rows[-1], file=sys.stderr, flush=True)
    print(f"{a.device}, torch {torch.__version__}; Qwen2.5-0.5B shape with {a.layers} layers, vocabulary {a.vocab:,}; "
          f"{G} completions of each length after a {PROMPT}-token prompt; checkpointing={a.checkpointing}; "
          f"{a.threads} thread(s) per rank; N > 1 under {a.parallel}; {trl_note}\n")  # fmt: skip
    print("| trainer | N | completion tokens | peak MB per rank | tokens/s | grad norm |\n|---|---|---|---|---|---|")
    print("\n".join(rows))
    for kind, n in runs:
        print(f"longest completion within {a.memory_limit_mb:,.0f} MB per rank, {kind} N = {n}: "
              f"{longest.get((kind, n), 0):,} tokens")  # fmt: skip
    return 0


def row(a, kind: str, n: int, length: int, model_dir: Path, tmp: Path, ran_out: int | None, longest: dict) -> str:
    """One table row; ``longest`` takes the length when the step fitted."""
    head = f"| {kind} | {n} | {length:,} |"
    if ran_out is not None:
        return f"{head} skipped: out of memory at {ran_out:,} already | - | - |"
    try:
        got = measure(a, model_dir, length, n, tmp, kind)
    except OutOfMemory as err:
        return f"{head} {err} | - | - |"
    except RuntimeError as err:
        return f"{head} failed: {str(err).splitlines()[0]} | - | - |"
    fits = got["peak_mb"] <= a.memory_limit_mb  # on CUDA the device's peak, which the host watchdog does not see
    if fits:
        longest[(kind, n)] = length
    return f"{head} {got['peak_mb']:,.0f}{'' if fits else ' (over)'} | {got['tokens_per_s']:,.0f} | {got['grad_norm']:.4e} |"


if __name__ == "__main__":
    sys.exit(main())
