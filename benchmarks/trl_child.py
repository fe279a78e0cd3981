"""One TRL GRPOTrainer run on the bench work, timed; prints one JSON line. Started by vs_trl.py."""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

from common import bench_prompts, peak_rss_mb, scratch_dir, set_threads


def exact_reward(completions, answer, **_):
    """The demo task's reward (exact match of the last line); its value does not affect the timing."""
    return [
        float(c.strip().splitlines()[-1:] == [a]) if c.strip() else 0.0
        for c, a in zip(completions, answer, strict=True)
    ]


class Timers:
    """Wraps the trainer's generation and reference forward, and times each optimizer step."""

    def __init__(self, trainer):
        self.gen, self.ref, self.steps = [], [], []
        self._gen_now = self._ref_now = 0.0
        gen_fn, logp_fn = trainer._generate_single_turn, trainer._get_per_token_logps_and_entropies

        def timed_gen(*a, **k):
            t = time.perf_counter()
            out = gen_fn(*a, **k)
            self._gen_now += time.perf_counter() - t
            return out

        def timed_logps(model, *a, **k):
            t = time.perf_counter()
            out = logp_fn(model, *a, **k)
            if model is trainer.ref_model:
                self._ref_now += time.perf_counter() - t
            return out

        trainer._generate_single_turn = timed_gen
        trainer._get_per_token_logps_and_entropies = timed_logps

    def callback(self):
        from transformers import TrainerCallback

        timers = self

        class StepTimer(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                timers._t0 = time.perf_counter()
                timers._gen_now = timers._ref_now = 0.0

            def on_step_end(self, args, state, control, **kw):
                timers.steps.append(time.perf_counter() - timers._t0)
                timers.gen.append(timers._gen_now)
                timers.ref.append(timers._ref_now)

        return StepTimer()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args()
    threads = set_threads(a.threads)
    warnings.filterwarnings("ignore")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    total = a.warmup + a.steps
    data = Dataset.from_list(bench_prompts(a.prompts * total))
    args = GRPOConfig(
        output_dir=str(scratch_dir("grpolab-bench-trl-")),
        per_device_train_batch_size=a.prompts * a.generations,
        gradient_accumulation_steps=1,
        num_generations=a.generations,
        max_completion_length=a.max_tokens,
        temperature=1.0,
        beta=0.04,
        num_iterations=1,
        loss_type="grpo",
        learning_rate=1e-5,
        max_steps=total,
        bf16=a.bf16,
        use_cpu=True,
        gradient_checkpointing=False,
        use_vllm=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        shuffle_dataset=False,
        seed=0,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=a.model, reward_funcs=exact_reward, args=args, train_dataset=data)
    timers = Timers(trainer)
    trainer.add_callback(timers.callback())
    tokens = []
    trainer.add_callback(_token_counter(trainer, tokens))
    trainer.train()
    w = a.warmup
    print(
        json.dumps(
            {
                "name": f"TRL GRPOTrainer ({'bf16' if a.bf16 else 'fp32'})",
                "threads": threads,
                "step_s": timers.steps[w:],
                "generation_s": timers.gen[w:],
                "reference_s": timers.ref[w:],
                "tokens": tokens[w:],
                "completions_per_step": a.prompts * a.generations,
                "peak_rss_mb": peak_rss_mb(),
                "pid": os.getpid(),
            }
        )
    )


def _token_counter(trainer, tokens):
    """Generated tokens per step, from the trainer's logged mean completion length."""
    from transformers import TrainerCallback

    class Counter(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                n = args.per_device_train_batch_size
                tokens.append(int(round(logs["completions/mean_length"] * n)))

    return Counter()


if __name__ == "__main__":
    main()
