"""One grpolab GRPO step on fixed-length completions, in its own process; prints one JSON line with its
peak memory, loss and gradient norm. Started by memory.py with the grpolab source (this tree's, or an
older revision's) first on PYTHONPATH; it uses only names both have."""

from __future__ import annotations

import argparse
import json

import torch
from common import peak_rss_mb


def qwen05b_two_layers():
    """Qwen2.5-0.5B's vocabulary, hidden size, heads and MLP, with 2 layers; fp32, random weights."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=2,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--max-tokens-per-micro-batch", type=int, default=None)
    p.add_argument("--gradient-checkpointing", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(1)
    from grpolab.config import load_config
    from grpolab.runtime.step_spec import logprob_context, update_spec
    from grpolab.training.step import update_policy
    from grpolab.types import RolloutBatch

    overrides = [
        f"rollout.num_generations={a.generations}",
        f"rollout.max_completion_length={a.tokens}",
        "train.prompts_per_step=1",
        f"train.micro_batch_size={a.generations}",
        "algo.beta=0.0",
        "model.autocast=none",
    ]
    if a.max_tokens_per_micro_batch:
        overrides.append(f"train.max_tokens_per_micro_batch={a.max_tokens_per_micro_batch}")
    cfg = load_config(None, overrides)
    model = qwen05b_two_layers()
    if a.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    gen = torch.Generator().manual_seed(0)
    n, t = a.generations, a.tokens
    prompt = torch.randint(100, 150000, (a.prompt,), generator=gen).tolist()
    ids = torch.randint(100, 150000, (n, t), generator=gen)
    mask = torch.ones(n, t, dtype=torch.bool)
    advantages = torch.linspace(-1, 1, n)[:, None].expand(n, t).contiguous()
    batch = RolloutBatch([prompt] * n, ids, mask, mask, advantages)
    optimizer, scheduler = _optimizer(cfg, model)
    forward_backward_peak = []
    step = optimizer.step

    def peak_then_step(*args, **kwargs):  # the forward + backward peak, before AdamW allocates its states
        forward_backward_peak.append(peak_rss_mb())
        return step(*args, **kwargs)

    optimizer.step = peak_then_step
    if torch.cuda.is_available():
        model.cuda()
        torch.cuda.reset_peak_memory_stats()
    metrics = update_policy(
        model, optimizer, scheduler, batch,
        update_spec(cfg, logprob_context(cfg, pad_id=0, autocast_dtype=None, device_type="cpu")),  # micro-batch size set
        generator=torch.Generator().manual_seed(0),
    )
    out = {
        "peak_rss_mb": peak_rss_mb(),
        "forward_backward_peak_mb": forward_backward_peak[0],
        "loss": metrics["loss"],
        "grad_norm": metrics["grad_norm"],
        "entropy": metrics["entropy"],
    }
    if torch.cuda.is_available():
        out["gpu_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    print(json.dumps(out))


def _optimizer(cfg, model):
    """The run's (optimizer, scheduler): today's ``run_optimizer``; an older revision's build_optimizer took the config."""
    try:
        from grpolab.runtime.step_spec import run_optimizer
    except ImportError:
        from grpolab.training.optim import build_optimizer

        return build_optimizer(model, cfg)
    return run_optimizer(cfg, model)


if __name__ == "__main__":
    main()
