"""Generated tokens per second: grpolab's sampler against plain ``model.generate``, same model and batch.

The bench model of vs_trl.py (~33.6M parameters), 4 prompts x 8 samples, 64 tokens each (its EOS is
unreachable, so every row runs to the limit), temperature 1. ``model.generate`` gets the 32 rows
(each prompt repeated 8 times) and returns only ids; the sampler also returns every sampled token's
log-prob. Runs are interleaved, after one warm-up each; medians are printed. The bf16 rows run only
where grpolab runs bf16 (a CPU with native bf16 instructions: common.bench_dtype).

    .venv/bin/python benchmarks/sampler_vs_generate.py [--threads N] [--repeats R]
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
from common import (
    auto_threads,
    bench_dtype,
    bench_prompts,
    median,
    save_bench_model,
    scratch_dir,
    set_threads,
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", default="auto")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    threads = set_threads(auto_threads() if a.threads == "auto" else int(a.threads))
    warnings.filterwarnings("ignore")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpolab.rollout.hf import HFSampler

    path = save_bench_model(scratch_dir("grpolab-sampler-") / "model")
    model, tok = AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    prompts = [tok(r["prompt"])["input_ids"] for r in bench_prompts(4)]
    rows = torch.tensor([q for q in prompts for _ in range(8)])
    gen = torch.Generator().manual_seed(0)

    def generate(dtype):
        amp = torch.autocast("cpu", dtype=dtype, enabled=dtype is not None)
        with torch.no_grad(), amp:
            out = model.generate(
                rows, attention_mask=torch.ones_like(rows), do_sample=True, max_new_tokens=64, pad_token_id=0
            )
        return out.shape[0] * (out.shape[1] - rows.shape[1])

    def sampler(dtype):
        out = HFSampler(model, tok, max_completion_length=64, autocast_dtype=dtype)
        return lambda: int(out.sample(prompts, num_generations=8, generator=gen).completion_mask.sum())

    runs = {"model.generate, fp32": lambda: generate(None), "grpolab HFSampler, fp32": sampler(None)}
    if bench_dtype() == torch.bfloat16:
        runs["model.generate, bf16 autocast"] = lambda: generate(torch.bfloat16)
        runs["grpolab HFSampler, bf16"] = sampler(torch.bfloat16)
    rates: dict[str, list[float]] = {k: [] for k in runs}
    for repeat in range(a.repeats + 1):
        for name, fn in runs.items():
            t = time.perf_counter()
            tokens = fn()
            if repeat:  # the first round warms up
                rates[name].append(tokens / (time.perf_counter() - t))
    base = median(rates["model.generate, fp32"])
    print(f"threads: {threads}; 32 rows x 64 tokens; median of {a.repeats} runs")
    for name, r in rates.items():
        print(f"{name:32s} {median(r):7.0f} tokens/s   x{median(r) / base:.2f}")


if __name__ == "__main__":
    main()
