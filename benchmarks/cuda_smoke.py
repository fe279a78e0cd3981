"""One-GPU smoke run of the CUDA path: FSDP2 with world size 1, bf16, a model of Qwen2.5-0.5B's shape.

    torchrun --nproc_per_node 1 benchmarks/cuda_smoke.py [--steps 5]

Builds a Qwen2 model with Qwen2.5-0.5B's body (hidden 896, 24 layers, 14 query / 2 KV heads, MLP 4864)
and random weights, with the character tokenizer of the demo (so its vocabulary, embeddings and head
are tiny: the count below is the parameters actually trained), trains a few GRPO steps through
``grpolab.train`` with train.parallel=fsdp and model.dtype=bfloat16, and prints completion tokens/s,
an MFU estimate and the peak GPU memory. Nothing leaves the machine; it writes under a temporary folder.

MFU = model FLOPs per second / the GPU's dense bf16 peak (--peak-tflops, default 989 for an H100/H200
SXM). Model FLOPs per completion token: 2N for sampling, 2N for the reference, 6N for the policy's
forward and backward (N = parameters); attention FLOPs and prompt tokens are left out (a lower bound).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


def build_model(folder: Path) -> int:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from grpolab.tasks.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    args = p.parse_args()
    import torch

    from grpolab.config import load_config
    from grpolab.tasks.arithmetic import arithmetic_examples
    from grpolab.commands.train import train

    assert torch.cuda.is_available(), "this smoke run needs a CUDA GPU"
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        n_params = build_model(model_dir)
        data = Path(tmp) / "data.jsonl"
        rows = arithmetic_examples(size=256, seed=0, digits=2)
        data.write_text("".join(json.dumps({"prompt": e.prompt, "answer": e.answer}) + "\n" for e in rows))
        cfg = load_config(None, [
            f"model.name_or_path={model_dir}", "model.dtype=bfloat16", "model.device=cuda", f"data.path={data}",
            "reward.functions=[{name: exact_match}]", f"rollout.num_generations={args.generations}",
            f"rollout.max_completion_length={args.length}", "rollout.temperature=1.0",
            f"train.prompts_per_step={args.prompts}", f"train.num_steps={args.steps}", "train.parallel=fsdp",
            "train.micro_batch_size=32", "optim.lr=1e-6", f"log.output_dir={tmp}", "log.run_name=smoke",
            "log.checkpoint_every=0", "log.progress=false",
        ])  # fmt: skip
        train(cfg)
        metrics = [json.loads(x) for x in (Path(tmp) / "smoke" / "metrics.jsonl").read_text().splitlines()]
        checkpoint = Path(tmp) / "smoke" / "checkpoints" / f"step_{args.steps}"
        assert (checkpoint / "dcp" / ".metadata").exists(), "no sharded checkpoint written"
    rows = metrics[1:] or metrics  # the first step warms up
    seconds = sum(r["sys/step_time_s"] for r in rows)
    tokens = sum(r["completions/mean_length"] * args.prompts * args.generations for r in rows)
    flops = 10 * n_params * tokens
    print(f"parameters {n_params / 1e6:.0f}M, {len(rows)} steps measured, {tokens / seconds:,.0f} completion tokens/s")
    print(f"MFU (lower bound) {flops / seconds / (args.peak_tflops * 1e12):.1%} of {args.peak_tflops} TFLOPS")
    print(f"peak GPU memory {max(r['sys/peak_mem_mb'] for r in metrics):,.0f} MiB")
    print("time split (last step): " + ", ".join(f"{k[9:]} {metrics[-1][k]:.2f}s" for k in metrics[-1] if k.startswith("sys/time_")))


if __name__ == "__main__":
    main()
