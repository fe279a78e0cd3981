"""One prepared check of the GPU path: GRPO on a Qwen2.5-0.5B-shaped model, one table, hard asserts.

    python benchmarks/gpu_check.py            # on a CUDA machine (an H200: well under 8 minutes)
    python benchmarks/gpu_check.py --smoke    # the same script on a CPU with a tiny model (< 3 minutes)

What it runs, each with the hf engine, ``--steps`` GRPO steps (5), a checkpoint at step ``--steps - 2``
and a ``--resume`` from it in a copy of the run folder:

* ``fp32+autocast``: fp32 weights (the masters) with bf16 autocast, one process;
* ``bf16``: bf16 weights with fp32 master weights in the optimizer (training/master.py), one process;
* ``fsdp2`` and ``ddp``: ``torchrun --nproc_per_node 1`` (NCCL on CUDA, gloo on a CPU), bf16 weights,
  sharded (DCP) checkpoints;
* ``long``: one GRPO update on two fixed completions of ``--long-length`` tokens (16,384; no generation, no
  resume), fp32 weights with bf16 autocast, gradient checkpointing, one process (train.sequence_parallel=1):
  the long-context memory and speed (benchmarks/long_context.py's step, in a fresh process).

The model has Qwen2.5-0.5B's shape and real vocabulary (151,936 ids; hidden 896, 24 layers, 14 query /
2 KV heads, MLP 4864, tied embeddings) with random weights, and a character tokenizer padded with
filler tokens to that vocabulary, so nothing is downloaded. ``--smoke`` swaps in a tiny model.

Per run the table gives completion tokens/s of sampling, trained tokens/s, training MFU, and the peak
allocated / reserved memory of each phase (rollout, reference, train; on a CPU the process's peak RSS).
MFU = 6 N (trained tokens) / training seconds / peak, N the parameters (the tied head counted once;
attention's own FLOPs left out, so a lower bound), and the peak is the device's bf16 matmul rate as
measured here at the start (8192^3 on CUDA), not a datasheet's.

Asserts: every logged loss and metric the run logs is finite, and the resumed run's metrics and final
weights equal the uninterrupted run's (to float tolerance on a CPU; within 1e-3 relative on CUDA). Every
run sets ``train.deterministic`` so that both use the same kernels (strict, as TRL's full_determinism:
should an op on the path have no deterministic CUDA kernel, the run is made again without it, and a note
under the table names the op). Each run's folders (~25 GB of checkpoints at the 0.5B shape) are removed
once it is checked, unless ``--keep DIR`` asks to keep them there (mind the disk). ``--table`` and ``--keep``
are checked to be writable before any work. A run that fails or fails an assert is a row that says so and the others still run;
a run that would end past ``--budget-s`` (450) is skipped: one call always ends with the table, then the
failures, and exits 1 if there were any.

On the lent H200 (its image: torch 2.11+cu130, transformers 5.17, peft, accelerate; nothing of
grpolab's installed), from the repository root, with nothing to install or carry:

    PYTHONUNBUFFERED=1 PYTHONPATH=src python3 benchmarks/gpu_check.py --table $OUT/gpu_check.md

grpolab's other dependencies (math-verify, reasoning-gym, datasets, ...) are imported only where used,
and none is on this path: ``--smoke`` passes under exactly the image's torch 2.11.0, transformers
5.17.0, tokenizers 0.23.2, safetensors 0.8.0 and accelerate 1.15.0 (torch's CUDA wheel, run on a CPU).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

QWEN_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "vocab_size": 151_936}  # fmt: skip
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": 512}  # fmt: skip
PHASES = ("rollout", "reference", "train")


def digit_fraction(completion, example) -> float:
    """A dense reward (``gpu_check:digit_fraction``): a random model never answers exactly, and an exact-match
    reward of 0 everywhere would give zero advantages, so no gradient, and a resume check that says nothing."""
    text = completion.text
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


def build_model(folder: Path, shape: dict) -> int:
    """Save a random-init Qwen2 of ``shape`` and a character tokenizer of its vocabulary; returns N."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

    from grpolab.tasks.tiny import BOS, DEFAULT_CHARS, EOS, PAD, UNK

    tokens = [PAD, BOS, EOS, UNK, *dict.fromkeys(DEFAULT_CHARS)]
    tokens += [f"<x{i}>" for i in range(shape["vocab_size"] - len(tokens))]  # ids the model may sample
    core = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(tokens)}, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK,
                                  padding_side="left", clean_up_tokenization_spaces=False)  # fmt: skip
    config = Qwen2Config(**shape, max_position_embeddings=4096, tie_word_embeddings=True, pad_token_id=0,
                         bos_token_id=1, eos_token_id=2)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def matmul_peak_tflops(device: str) -> float:
    """The device's bf16 matmul rate, measured: the best of a few timed products."""
    import torch

    n = 8192 if device == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    best = math.inf
    for i in range(8):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10 if device == "cuda" else 2):
            a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= 2:  # the first ones warm up
            best = min(best, (time.perf_counter() - t0) / (10 if device == "cuda" else 2))
    return 2 * n**3 / best / 1e12


def overrides(a, model_dir: Path, data: Path, out: Path, name: str, extra: list[str]) -> list[str]:
    g = a.generations
    return [
        f"model.name_or_path={model_dir}", f"model.device={a.device}", f"data.path={data}",
        "reward.functions=[{name: 'gpu_check:digit_fraction'}]", f"rollout.num_generations={g}",
        f"rollout.max_completion_length={a.length}", "rollout.temperature=1.0", f"train.prompts_per_step={a.prompts}",
        f"train.num_steps={a.steps}", f"train.micro_batch_size={a.micro_batch}", "optim.lr=1e-5",
        f"log.output_dir={out}", f"log.run_name={name}", f"log.checkpoint_every={a.steps - 2}", "log.keep_last=2",
        "log.progress=false", "train.max_no_signal_steps=0", *extra,
    ]  # fmt: skip


def train_and_resume(a, args: list[str], out: Path, name: str) -> None:
    """The uninterrupted run, then a copy of its folder resumed from the step ``steps - 2`` checkpoint (the
    copy leaves out the last checkpoint: at the 0.5B shape each holds ~6 GB of weights and AdamW states)."""
    from grpolab.commands.train import train
    from grpolab.config import load_config

    train(load_config(None, args))
    resumed = out / f"{name}_resumed"
    last = f"step_{a.steps}"
    shutil.copytree(out / name, resumed, ignore=lambda folder, names: [last] if Path(folder).name == "checkpoints" else [])
    train(load_config(None, [*args, f"log.run_name={name}_resumed"]), resume=True)


def child(a) -> None:
    """Under torchrun: one run of ``a.child`` (fsdp / ddp) and its resume."""
    out = Path(a.out)
    train_and_resume(a, overrides(a, Path(a.model), Path(a.data), out, a.child, json.loads(a.extra)), out, a.child)


def final_weights(run_dir: Path, step: int) -> dict:
    import torch
    from safetensors.torch import load_file

    folder = run_dir / "checkpoints" / f"step_{step}"
    if (folder / "dcp").is_dir():
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        whole = folder.parent / f"full_{step}.pt"
        dcp_to_torch_save(folder / "dcp", whole)
        state = torch.load(whole, weights_only=False)["model"]
        whole.unlink()
        return state
    return load_file(str(folder / "model.safetensors"))


def check(a, out: Path, name: str, n_params: int, peak: float) -> dict:
    """The run's table row, with ``problems``: a non-finite metric, no gradient, or a resume that differs."""
    from grpolab.runtime.logging import read_metrics

    rows, again = read_metrics(out / name), read_metrics(out / f"{name}_resumed")
    steps = list(range(1, a.steps + 1))
    if [r["step"] for r in rows] != steps or [r["step"] for r in again] != steps:
        return {"run": name, "problems": [f"steps logged {[r['step'] for r in rows]} / resumed {[r['step'] for r in again]}"]}
    problems = []
    if max(abs(r["grad_norm"]) for r in rows) == 0:
        problems.append("no gradient (all advantages zero): the checks would say nothing")
    for r in rows:
        bad = [k for k, v in r.items() if v is None or (isinstance(v, float) and not math.isfinite(v))]
        bad = [k for k in bad if not k.startswith(("rewards/", "completions/", "kl"))]  # may be NaN by design
        if bad or not math.isfinite(r["loss"]):
            problems.append(f"step {r['step']}: not finite: {bad or 'loss'}")
    rel = 1e-5 if a.device == "cpu" else 1e-3
    for x, y in zip(rows, again, strict=True):
        differ = [f"{k}: {x[k]} != {y[k]}" for k in x
                  if not k.startswith("sys/") and isinstance(x[k], float) and math.isfinite(x[k])
                  and not abs(x[k] - y.get(k, math.nan)) <= rel * max(1.0, abs(x[k]))]  # fmt: skip
        if differ:
            problems.append(f"resume differs at step {x['step']}: " + "; ".join(differ[:4]))
    want, got = final_weights(out / name, a.steps), final_weights(out / f"{name}_resumed", a.steps)
    worst = max(float((want[k].float() - got[k].float()).abs().max()) for k in want)
    if not worst <= (1e-6 if a.device == "cpu" else 1e-3):
        problems.append(f"resumed weights differ by {worst}")
    timed = rows[1:] or rows  # the first step warms up
    gen_s = sum(r["sys/time_generation_s"] for r in timed)
    train_s = sum(r["sys/time_training_s"] for r in timed)
    completion = sum(r["completions/mean_length"] * a.prompts * a.generations for r in timed)
    trained = rows[-1]["num_tokens"] - (rows[0]["num_tokens"] if len(rows) > 1 else 0)
    mem = {p: (r.get(f"sys/peak_mem_{p}_mb"), r.get(f"sys/peak_reserved_{p}_mb")) for p in PHASES for r in rows[-1:]}
    return {
        "run": name, "gen tok/s": completion / gen_s, "train tok/s": trained / train_s,
        "MFU %": 100 * 6 * n_params * trained / train_s / (peak * 1e12), "loss": rows[-1]["loss"],
        "grad norm": rows[-1]["grad_norm"], "reward": rows[-1]["reward"],
        "peak MB": rows[-1]["sys/peak_mem_mb"], "mem": mem, "resume max |dw|": worst, "problems": problems,
    }  # fmt: skip


def table(rows: list[dict], device: str) -> str:
    cuda = device == "cuda"
    head = ["run", "gen tok/s", "train tok/s", "MFU %", "loss", "grad norm", "reward", "resume max |dw|"]
    head += [f"{p} alloc/res MB" for p in PHASES] if cuda else ["peak RSS MB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "loss" not in r:  # the run failed or was skipped before it logged
            lines.append("| " + " | ".join([r["run"], *["-"] * (len(head) - 1)]) + " |")
            continue
        cells = [r["run"], f"{r['gen tok/s']:,.0f}", f"{r['train tok/s']:,.0f}", f"{r['MFU %']:.1f}", f"{r['loss']:.2e}",
                 f"{r['grad norm']:.3f}", f"{r['reward']:.3f}",
                 f"{r['resume max |dw|']:.1e}"]  # fmt: skip
        if cuda:
            cells += [f"{r['mem'][p][0]:,.0f} / {r['mem'][p][1]:,.0f}" for p in PHASES]
        else:
            cells.append(f"{r['peak MB']:,.0f}")
        lines.append("| " + " | ".join(c.replace("nan", "-") for c in cells) + " |")  # the long row: no rollout
    return "\n".join(lines)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a tiny model on this machine's CPU")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=None)
    p.add_argument("--generations", type=int, default=None)
    p.add_argument("--length", type=int, default=None)
    p.add_argument("--micro-batch", type=int, default=None)
    p.add_argument("--only", default="fp32+autocast,bf16,fsdp2,ddp,long", help="comma-separated runs")
    p.add_argument("--long-length", type=int, default=None, help="completion tokens of the long run (16384)")
    p.add_argument("--keep", default=None,
                   help="write the runs here and keep them, ~25 GB each at the 0.5B shape (default: a temporary "
                        "folder, each run removed once checked)")  # fmt: skip
    p.add_argument("--table", default=None, help="also write the table, its header and any failures to this file")
    p.add_argument("--budget-s", type=float, default=450.0,
                   help="start no run that would end past this many seconds, judged by the longest run so far")  # fmt: skip
    for hidden in ("--child", "--model", "--data", "--out", "--extra", "--device"):
        p.add_argument(hidden, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    small = a.smoke
    a.prompts = a.prompts or (4 if small else 32)
    a.generations = a.generations or (2 if small else 8)
    a.length = a.length or (8 if small else 256)
    a.micro_batch = a.micro_batch or (8 if small else 64)
    a.long_length = a.long_length or (256 if small else 16_384)
    assert a.steps >= 3, "--steps must be >= 3 (a checkpoint at steps - 2, then a resume)"
    return a


RUNS = {  # name -> (overrides, launched by torchrun)
    "fp32+autocast": (["model.dtype=float32", "model.autocast=bf16", "train.parallel=none"], False),
    "bf16": (["model.dtype=bfloat16", "train.parallel=none"], False),
    "fsdp2": (["model.dtype=bfloat16", "train.parallel=fsdp"], True),
    "ddp": (["model.dtype=bfloat16", "train.parallel=ddp"], True),
}


def main(argv=None) -> int:
    here = str(Path(__file__).resolve().parent)  # the reward above, for the reward workers and torchrun's children
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, here)
    a = parse(argv)
    if not a.child and not writable(a):
        return 2
    # train.deterministic's cuBLAS workspace, before the first matmul (the peak below) makes a cuBLAS handle
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if a.child:
        child(a)
        return 0
    import torch

    a.device = "cpu" if a.smoke else "cuda"
    assert a.smoke or torch.cuda.is_available(), "no CUDA device: run with --smoke on a CPU"
    t_start = time.perf_counter()
    peak = matmul_peak_tflops(a.device)
    tmp = tempfile.mkdtemp(prefix="gpu_check_") if a.keep is None else a.keep
    out = Path(tmp)
    try:
        model_dir, data = out / "model", out / "data.jsonl"
        n_params = build_model(model_dir, TINY if a.smoke else QWEN_05B)
        from grpolab.tasks.arithmetic import arithmetic_examples

        examples = arithmetic_examples(size=256, seed=0, digits=2)
        data.write_text("".join(json.dumps({"prompt": e.prompt, "answer": e.answer}) + "\n" for e in examples))
        rows, longest = [], 0.0  # the longest run so far: the budget's estimate of the next one
        for name in a.only.split(","):
            t0 = time.perf_counter()
            if t0 - t_start + longest > a.budget_s:
                rows.append({"run": name, "problems": [f"skipped: it would end past --budget-s {a.budget_s:.0f}"]})
                continue
            rows.append(run_one(a, name, model_dir, data, out, n_params, peak))
            longest = max(longest, time.perf_counter() - t0)
            print(f"{name}: done in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        device = torch.cuda.get_device_name() if a.device == "cuda" else "CPU"
        report = [
            f"{device}, torch {torch.__version__}; {n_params / 1e6:.1f}M parameters; measured bf16 matmul peak "
            f"{peak:.1f} TFLOP/s; {a.steps} steps of {a.prompts} x {a.generations} completions of up to {a.length} "
            f"tokens per run; {time.perf_counter() - t_start:.0f} s in all", "", table(rows, a.device), "",
        ]  # fmt: skip
        report += [f"note: {r['run']} {n}" for r in rows for n in r.get("notes", [])]
        failed = [f"- {r['run']}: {p}" for r in rows for p in r["problems"]]
        report += ["FAILED:", *failed] if failed else ["all asserts passed: finite loss and metrics; resume == uninterrupted"]
        print("\n" + "\n".join(report), flush=True)
        if a.table:
            Path(a.table).write_text("\n".join(report) + "\n")
    finally:
        if a.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


def writable(a) -> bool:
    """--table and --keep can be written, checked before any work (a table that cannot be written would
    otherwise be a traceback at the end, the work lost); False after one line saying which."""
    try:
        if a.keep is not None:
            Path(a.keep).mkdir(parents=True, exist_ok=True)
        if a.table:
            with open(a.table, "a"):  # creates it, or leaves what is there until the table replaces it
                pass
    except OSError as err:
        print(f"gpu_check: error: {err.filename}: {err.strerror}; give a writable --table file and --keep folder",
              file=sys.stderr)  # fmt: skip
        return False
    return True


def run_one(a, name: str, model_dir: Path, data: Path, out: Path, n_params: int, peak: float) -> dict:
    """One run of RUNS and its resume, checked; a run that fails is a row that says so, and the others still
    run, so that one call always ends with the table."""
    import torch

    from grpolab.errors import NONDETERMINISTIC_OP

    if name == "long":
        return long_row(a, model_dir, out, n_params, peak)
    extra, launched = RUNS[name]
    notes = []
    for deterministic in (True, False):  # the same kernels in both runs (resume == uninterrupted) if torch can
        _remove_run(out, name)  # what a try before this one (or an earlier call with this --keep) left
        gc.collect()  # the last in-process run's memory, so that this run's figures are its own
        if a.device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        torch.use_deterministic_algorithms(False)  # set by an earlier in-process run
        args = [*extra, f"train.deterministic={str(deterministic).lower()}"]
        try:
            if launched:
                _torchrun(a, name, model_dir, data, out, args)
            else:
                train_and_resume(a, overrides(a, model_dir, data, out, name, args), out, name)
            return {**check(a, out, name, n_params, peak), "notes": notes}
        except Exception as err:  # the table must still come out
            traceback.print_exc()
            text = str(err).strip()
            if not (deterministic and NONDETERMINISTIC_OP in text):
                return {"run": name, "notes": notes, "problems": [f"{type(err).__name__}: {text[-1500:]}"]}
            op = text[: text.index(NONDETERMINISTIC_OP)].split()[-1]  # once more without: its numbers, flagged
            notes.append(f"ran with train.deterministic=false: {op} has no deterministic kernel here")
        finally:  # each run writes ~25 GB of checkpoints at the 0.5B shape; the disk holds 64 GB
            if a.keep is None:
                _remove_run(out, name)
    raise AssertionError("unreachable")


def long_row(a, model_dir: Path, out: Path, n_params: int, peak: float) -> dict:
    """The ``long`` run's row: one checkpointed GRPO update at ``--long-length`` tokens; its loss and gradient
    norm must be finite and the gradient not zero."""
    from long_context import PROMPT, G, measure

    setting = argparse.Namespace(device=a.device, checkpointing="true")
    try:
        got = measure(setting, model_dir, a.long_length, 1, out)
    except Exception as err:  # the table must still come out
        traceback.print_exc()
        return {"run": "long", "problems": [f"{type(err).__name__}: {str(err).strip()[-1500:]}"]}
    problems = [] if math.isfinite(got["loss"]) and math.isfinite(got["grad_norm"]) else ["not finite: loss or grad norm"]
    problems += [] if got["grad_norm"] > 0 else ["no gradient: the step says nothing"]
    trained = G * (PROMPT + a.long_length)
    return {
        "run": f"long ({a.long_length:,} tok)", "gen tok/s": math.nan, "train tok/s": got["tokens_per_s"],
        "MFU %": 100 * 6 * n_params * trained / got["seconds"] / (peak * 1e12), "loss": got["loss"],
        "grad norm": got["grad_norm"], "reward": math.nan, "peak MB": got["peak_mb"], "resume max |dw|": math.nan,
        "mem": {p: (got["peak_mb"], math.nan) if p == "train" else (math.nan, math.nan) for p in PHASES},
        "problems": problems,
    }  # fmt: skip


def _remove_run(out: Path, name: str) -> None:
    shutil.rmtree(out / name, ignore_errors=True)
    shutil.rmtree(out / f"{name}_resumed", ignore_errors=True)


def _torchrun(a, name: str, model_dir: Path, data: Path, out: Path, extra: list[str]) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), __file__, "--child", name, "--model", str(model_dir), "--data", str(data),
           "--out", str(out), "--extra", json.dumps(extra), "--device", a.device, "--steps", str(a.steps),
           "--prompts", str(a.prompts), "--generations", str(a.generations), "--length", str(a.length),
           "--micro-batch", str(a.micro_batch)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
    if done.returncode != 0:
        from grpolab.errors import NONDETERMINISTIC_OP

        sys.stderr.write(done.stderr[-8000:])
        # the child's error line, not torchrun's summary after it (an op without a deterministic kernel: a retry)
        causes = [line for line in done.stderr.splitlines() if NONDETERMINISTIC_OP in line]
        raise RuntimeError(f"torchrun {name} exited {done.returncode}: {causes[-1] if causes else done.stderr.strip()[-1200:]}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
