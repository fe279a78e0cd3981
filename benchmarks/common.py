"""What the benchmarks share: the ~33M-parameter bench model, its prompts, and measurement helpers."""

from __future__ import annotations

import atexit
import contextlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from grpolab.tasks.arithmetic import arithmetic_examples
from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model

END = "<end>"
"""The bench model's EOS: a token the model cannot emit, so every completion runs to the length limit."""


def save_bench_model(path: Path, *, hidden: int = 512, layers: int = 8, heads: int = 8, seed: int = 0) -> str:
    """Qwen2-style model (hidden 512, 8 layers, 8 heads: ~33.6M parameters) and char tokenizer.

    A random model emits the char tokenizer's EOS about once in 80 tokens, so half the completions of
    64 tokens would stop early and the two trainers would do different work. The saved tokenizer's EOS
    is an extra token outside the model's vocabulary instead: both sides generate exactly 64 tokens.
    """
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=hidden, num_layers=layers, num_heads=heads, seed=seed)
    tok.add_special_tokens({"eos_token": END})
    model.config.eos_token_id = tok.eos_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def bench_prompts(count: int, *, seed: int = 0) -> list[dict[str, str]]:
    """3-digit additions ("123+456="), the demo task's prompts."""
    return [{"prompt": e.prompt, "answer": e.answer} for e in arithmetic_examples(size=count, seed=seed)]


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def auto_threads() -> int:
    """The cores that the load average leaves idle, at least one.

    More OpenMP threads than free cores make every thread wait at each barrier for a descheduled
    peer: on this 2-core machine under other users' load, 2 threads ran a GRPO step 5-10x slower
    than 1 thread.
    """
    busy = int(os.getloadavg()[0] + 0.5)
    return max(1, available_cores() - busy)


def set_threads(threads: int | None = None) -> int:
    """Intra-op threads: ``threads``, or one per core the process may run on."""
    threads = threads or available_cores()
    torch.set_num_threads(threads)
    return threads


def peak_rss_mb() -> float:
    """This process's own peak resident memory in MB: Linux's VmHWM (ru_maxrss carries the parent's RSS across
    fork and exec, so a child of a benchmark that had imported torch started at its parent's peak); elsewhere
    ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024


def bench_dtype() -> torch.dtype:
    """The dtype grpolab computes in on this CPU with ``model.autocast: auto``: bf16 where the CPU has
    native bf16 matrix instructions (AVX512-BF16 / AMX; GRPOLAB_CPU_BF16 overrides), else fp32.
    Every speed figure and every peer runs in this dtype, so the comparison is like with like."""
    from grpolab.models.loading import cpu_has_bf16_matmul

    return torch.bfloat16 if cpu_has_bf16_matmul() else torch.float32


def _matmul_rate(size: int, dtype: torch.dtype, seconds: float) -> float:
    """Best GFLOP/s of ``size``^3 matmuls in ``dtype`` over about ``seconds`` (one warm-up first)."""
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    a @ b
    rates = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or not rates:
        t = time.perf_counter()
        a @ b
        rates.append(2 * size**3 / (time.perf_counter() - t) / 1e9)
    return max(rates)


def bf16_speed_ratio(size: int = 256, seconds: float = 0.2) -> float:
    """bf16 / fp32 matmul throughput from a short timed probe (well under a second on any CPU).

    Native bf16 (AVX512-BF16, AMX) runs at ~1-2x fp32 or more; emulated bf16 (AVX2 only) at ~0.05x
    (measured on a Zen 3: 0.68 against 15 GFLOP/s), where a bf16 peer would take hours."""
    return _matmul_rate(size, torch.bfloat16, seconds) / _matmul_rate(size, torch.float32, seconds)


def peak_gflops(dtype: torch.dtype, size: int = 2048, seconds: float = 3.0) -> float:
    """Best-of-repeats GFLOP/s of a big matmul loop in ``dtype``: the machine's practical peak.

    The matrix size shrinks (to at least 256) until one matmul takes under ~0.5 s, so the loop ends
    in about ``seconds`` on a slow CPU too."""
    small = _matmul_rate(256, dtype, 0.05)
    while size > 256 and 2 * size**3 / (small * 1e9) > 0.5:
        size //= 2
    return _matmul_rate(size, dtype, seconds)


def dtype_name(dtype: torch.dtype | None) -> str:
    return "bf16" if dtype == torch.bfloat16 else "fp32"


def median(xs) -> float:
    return statistics.median(xs) if xs else float("nan")


def scratch_dir(prefix: str = "grpolab-bench-") -> Path:
    """A temporary folder removed when this process exits: a benchmark's models, runs and checkpoints (hundreds of
    MB to GB a run) would otherwise pile up in the temporary folder, run after run, until the disk is full."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, True)
    return path


@contextlib.contextmanager
def checkout_of(rev: str | None) -> Iterator[Path | None]:
    """The ``src`` folder of a detached git worktree of ``rev`` (removed afterwards), or None for no rev: a
    child of that checkout started with PYTHONPATH=<that folder> runs that commit's grpolab instead of
    today's, so one benchmark run times both (--before-rev)."""
    if rev is None:
        yield None
        return
    repo = Path(__file__).resolve().parent.parent
    folder = Path(tempfile.mkdtemp(prefix="grpolab-before-"))
    try:
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", str(folder), rev], check=True,
                       capture_output=True, text=True)
    except subprocess.CalledProcessError as err:
        sys.exit(f"--before-rev {rev}: git worktree add failed: {err.stderr.strip()}")
    try:
        yield folder / "src"
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(folder)], capture_output=True)


def child_env(src: Path | None) -> dict[str, str]:
    """The environment of a benchmark child: offline, and importing grpolab from ``src`` when given."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
    return env
