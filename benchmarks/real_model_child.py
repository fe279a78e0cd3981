"""One GRPO run of benchmarks/real_model.py, grpolab or TRL, in its own process; prints one JSON line.

Both read the same JSONL of training prompts in the order they are used (prompts_per_step rows per
step, shuffling off), render them with the tokenizer's chat template, and save the final model.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path

from common import peak_rss_mb, scratch_dir, set_threads


def run_grpolab(a: argparse.Namespace) -> dict:
    from grpolab.commands.train import train
    from grpolab.config import load_config
    from grpolab.runtime.logging import read_metrics

    cfg = load_config(a.config, json.loads(a.overrides))
    result = train(cfg)
    rows = read_metrics(result.run_dir)
    return {
        "model": str(result.run_dir / "checkpoints" / f"step_{result.final_step}"),
        "step_s": [r["sys/step_time_s"] for r in rows],
        "reward": [_first(r, "reward", "train/reward_mean") for r in rows],
    }


def run_trl(a: argparse.Namespace) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpolab.rewards.rules import extract_last_number

    w = json.loads(a.trl_args)
    rows = [json.loads(line) for line in Path(a.prompts).read_text().splitlines() if line]
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in rows])

    def last_number_reward(completions, answer, **_):
        """grpolab's exact_match with extract=last_number, on TRL's conversational completions."""
        return [float(extract_last_number(c[0]["content"]) == ans) for c, ans in zip(completions, answer, strict=True)]

    out = Path(a.out) if a.out else scratch_dir("grpolab-real-model-")
    args = GRPOConfig(
        output_dir=str(out / "trl"),
        per_device_train_batch_size=w["prompts"] * w["generations"],  # completions per step
        gradient_accumulation_steps=1,
        num_generations=w["generations"],
        max_completion_length=w["max_tokens"],
        temperature=w["temperature"],
        beta=w["beta"],
        num_iterations=1,
        loss_type="grpo",  # grpolab's seq-mean-token-mean
        learning_rate=w["lr"],
        lr_scheduler_type="constant",
        adam_beta2=0.99,  # grpolab's optim.betas
        max_grad_norm=1.0,
        max_steps=w["steps"],
        bf16=w["bf16"],
        use_cpu=True,
        use_vllm=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        shuffle_dataset=False,
        seed=w["seed"],
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=a.model, reward_funcs=last_number_reward, args=args, train_dataset=data)
    steps: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.t0 = time.perf_counter()

        def on_step_end(self, *_, **__):
            steps.append(time.perf_counter() - self.t0)

    trainer.add_callback(StepTimer())
    trainer.train()
    final = out / "trl_final"
    trainer.save_model(str(final))
    trainer.processing_class.save_pretrained(str(final))
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {"model": str(final), "step_s": steps, "reward": rewards}


def _first(row: dict, *keys: str):
    return next((row[k] for k in keys if k in row), None)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("trainer", choices=["grpolab", "trl"])
    p.add_argument("--model", help="TRL: the plain model folder")
    p.add_argument("--prompts", help="TRL: JSONL of training prompts in step order")
    p.add_argument("--trl-args", default="{}", help="TRL: the shared settings as JSON")
    p.add_argument("--config", help="grpolab: the recipe config")
    p.add_argument("--overrides", default="[]", help="grpolab: dotted overrides as a JSON list")
    p.add_argument("--out", default=None, help="the run folder (default: a temporary one, removed at exit)")
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args()
    threads = set_threads(a.threads)
    warnings.filterwarnings("ignore")
    t0 = time.perf_counter()
    result = run_grpolab(a) if a.trainer == "grpolab" else run_trl(a)
    result.update(wall_s=time.perf_counter() - t0, peak_rss_mb=peak_rss_mb(), threads=threads, pid=os.getpid())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
