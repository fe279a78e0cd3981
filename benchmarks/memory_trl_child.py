"""One TRL GRPOTrainer step on the memory benchmark's model and work, in its own process; prints one JSON
line with its peak memory. Started by memory.py. Completions are forced to the full length
(min_new_tokens), so the step, not generation length, sets the work."""

from __future__ import annotations

import argparse
import json
import warnings

import torch
from common import peak_rss_mb, scratch_dir
from memory_child import qwen05b_two_layers


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--generations", type=int, default=8)
    a = p.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from grpolab.tasks.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    model = qwen05b_two_layers()
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    data = Dataset.from_list([{"prompt": "123+456=789; 321+654=975; 11+22="}] * 2)
    args = GRPOConfig(
        output_dir=str(scratch_dir("grpolab-memory-trl-")),
        per_device_train_batch_size=a.generations,
        gradient_accumulation_steps=1,
        num_generations=a.generations,
        max_completion_length=a.tokens,
        generation_kwargs={"min_new_tokens": a.tokens},
        temperature=1.0,
        beta=0.0,
        num_iterations=1,
        loss_type="grpo",
        learning_rate=1e-6,
        max_steps=1,
        bf16=False,
        use_cpu=True,
        use_vllm=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=0,
        dataloader_num_workers=0,
    )
    lengths = []

    def reward(completions, **_):  # distinct rewards, so the advantages are not all zero
        lengths.extend(len(c) for c in completions)
        return [float(i % 2) for i in range(len(completions))]

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok)
    trainer.train()
    print(json.dumps({"peak_rss_mb": peak_rss_mb()}))


if __name__ == "__main__":
    main()
