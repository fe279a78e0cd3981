"""Generation engines side by side: grpolab's own decoder (``rollout.engine=hf``) against vLLM
(``rollout.engine=vllm``), and TRL's GRPOTrainer with ``use_vllm=True, vllm_mode="colocate"``.

The work, ``--shape``: ``smollm2`` (the default), the SmolLM2-135M shape (LlamaForCausalLM, hidden 576, 30
layers, 9 heads, 3 KV heads, intermediate 1536, vocabulary 49152, tied embeddings), randomly initialised in
code and saved to a temporary folder with the character tokenizer; or ``bench``, the bench model of
vs_trl.py and sampler_vs_generate.py (common.save_bench_model: Qwen2, hidden 512, 8 layers, 8 heads, MLP
2048, character tokenizer, 33.6M parameters, random weights), whose defaults are its work: 4 prompts x 8
completions x 64 tokens. vLLM refuses a stop token outside the vocabulary, which is how the bench model makes
every completion run to the limit, so here the EOS is the tokenizer's own: the random model emits it about
once in 80 tokens, and each engine's token count (printed) is what it sampled.
``--prompts`` 3-digit additions x G = ``--generations`` completions of up to ``--max-tokens`` tokens at
temperature 1 (a random SmolLM2-shape model almost never emits the EOS, so nearly every completion runs to
the limit). Measured, each in its own process, one after the other on the same CPU with the same threads:

* sampling: tokens/s of ``--repeats`` timed ``sample`` calls (seeds 0, 1, ...; after a short warm-up call) in
  one process per engine, hf then vllm, ``--rounds`` times alternating (engine start-up reported apart); the
  figure is every timed call's tokens over their seconds, with the median call beside it;
* a whole GRPO step (``grpolab train``, beta 0.04, mu 1, the trainer under bf16 autocast where the CPU
  has bf16, as ``model.autocast=auto`` chooses): ``sys/step_time_s`` of the last of ``--steps`` steps,
  hf then vllm (vllm's includes the weight sync after the update);
* TRL's GRPOTrainer, colocated vLLM, the same work and the last step's time, or the error it stops with.

    .venv/bin/python benchmarks/rollout_engines.py [--shape smollm2|bench] [--prompts 1] [--generations 16]
                                                   [--max-tokens 256] [--steps 2] [--threads N] [--skip-trl]
                                                   [--sample-only] [--repeats 1] [--rounds 1]

The sampling ratio printed is hf / vllm, the step ratio hf's time over vllm's. On a shared machine every figure is contaminated by the other load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import scratch_dir

HERE = Path(__file__).parent
SMOLLM2_135M = {
    "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
    "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True, "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "hidden_act": "silu",
}  # fmt: skip


SHAPE_WORK = {"smollm2": (1, 16, 256), "bench": (4, 8, 64)}
"""Default (prompts, generations, max tokens) of each --shape."""


def save_model(path: Path, shape: str = "smollm2") -> str:
    """The SmolLM2-135M shape with random weights (std 0.02), and the character tokenizer; or the bench model."""
    import torch

    if shape == "bench":  # common.save_bench_model's model, with the tokenizer's own EOS (see the docstring)
        from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model

        tok = build_char_tokenizer()
        build_tiny_model(tok, hidden_size=512, num_layers=8, num_heads=8, seed=0).save_pretrained(path)
        tok.save_pretrained(path)
        return str(path)
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpolab.tasks.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    config = LlamaConfig(
        **SMOLLM2_135M, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def run_config(model: str, engine: str, a, out: str):
    from grpolab.config import config_from_dict

    return config_from_dict(
        {
            "model": {"name_or_path": model},
            "data": {"source": "arithmetic", "size": 64, "params": {"digits": 3}, "max_prompt_length": 32},
            "rollout": {"engine": engine, "num_generations": a.generations, "max_completion_length": a.max_tokens},
            "algo": {"name": "grpo", "beta": 0.04, "mu": 1},
            "reward": {"functions": [{"name": "exact_match", "kwargs": {"extract": "none"}}]},
            "train": {"num_steps": a.steps, "prompts_per_step": a.prompts, "micro_batch_size": 8},
            "log": {"output_dir": out, "run_name": engine, "progress": False, "checkpoint_every": 0, "tensorboard": False},
            "vllm": {"kv_cache_space_gb": 1.0},
        }
    )


def child_sample(a) -> dict:
    import torch

    from grpolab.models.loading import load_policy, resolve_autocast, resolve_device
    from grpolab.rollout.engines import build_sampler
    from grpolab.runtime.engine_spec import engine_spec
    from grpolab.tasks.arithmetic import arithmetic_examples

    cfg = run_config(a.model, a.engine, a, str(scratch_dir("grpolab-engines-")))
    model, tok = load_policy(cfg.model)
    amp = resolve_autocast(cfg.model, resolve_device(cfg.model))
    t0 = time.perf_counter()
    sampler = build_sampler(engine_spec(cfg), policy=model, tokenizer=tok, autocast_dtype=amp)
    start_s = time.perf_counter() - t0
    prompts = [tok.encode(e.prompt) for e in arithmetic_examples(size=a.prompts, seed=0, digits=3)]
    sampler.sample(prompts[:1], num_generations=2, generator=torch.Generator().manual_seed(1))  # warm-up
    calls = []
    for seed in range(a.repeats):  # the same seeds for each engine (their streams differ: other samples)
        t0 = time.perf_counter()
        out = sampler.sample(prompts, num_generations=a.generations, generator=torch.Generator().manual_seed(seed))
        calls.append((int(out.lengths.sum()), time.perf_counter() - t0))
    tokens, seconds = (sum(c[i] for c in calls) for i in (0, 1))
    return {"engine": a.engine, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "per_call": [round(n / s) for n, s in calls], "start_s": start_s, "autocast": str(amp)}  # fmt: skip


def child_step(a) -> dict:
    from grpolab.commands.train import train
    from grpolab.runtime.logging import read_metrics

    out = str(scratch_dir("grpolab-engines-"))
    rows = read_metrics(train(run_config(a.model, a.engine, a, out)).run_dir)
    last = {k: round(v, 2) for k, v in rows[-1].items() if k.startswith("sys/time") or k == "sys/step_time_s"}
    return {"engine": a.engine, "step_s": [r["sys/step_time_s"] for r in rows], "last_step": last}


def child_trl(a) -> dict:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpolab.tasks.arithmetic import arithmetic_examples

    rows = [{"prompt": e.prompt, "answer": e.answer} for e in arithmetic_examples(size=a.prompts * a.steps, seed=0, digits=3)]
    steps: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            steps.append(time.perf_counter() - self.t0)

    args = GRPOConfig(
        output_dir=str(scratch_dir("grpolab-engines-trl-")), per_device_train_batch_size=a.prompts * a.generations,
        num_generations=a.generations, max_completion_length=a.max_tokens, temperature=1.0, beta=0.04,
        loss_type="grpo", learning_rate=1e-5, max_steps=a.steps, use_cpu=True, bf16=a.bf16, report_to="none",
        save_strategy="no", logging_steps=1, seed=0, use_vllm=True, vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.05, vllm_max_model_length=64 + a.max_tokens,
    )  # fmt: skip

    def reward(completions, answer, **_):
        return [float(c.strip() == x) for c, x in zip(completions, answer, strict=True)]

    try:
        trainer = GRPOTrainer(model=a.model, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows))
        trainer.add_callback(Timer())
        trainer.train()
    except Exception as err:  # noqa: BLE001 - reported, not hidden: the parent prints it
        return {"engine": "trl-vllm-colocate", "error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}
    return {"engine": "trl-vllm-colocate", "step_s": steps}


def run_child(part: str, engine: str, model: str, a) -> dict:
    args = [sys.executable, __file__, "--child", part, "--engine", engine, "--model", model,
            "--prompts", str(a.prompts), "--generations", str(a.generations), "--max-tokens", str(a.max_tokens),
            "--steps", str(a.steps), "--repeats", str(a.repeats)] + (["--bf16"] if a.bf16 else [])  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), str(HERE)])}  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"engine": engine, "error": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"}
    return json.loads(lines[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPE_WORK), default="smollm2", help="the model (see the docstring)")
    p.add_argument("--prompts", type=int, default=None, help="default: 1 (smollm2), 4 (bench)")
    p.add_argument("--generations", type=int, default=None, help="default: 16 (smollm2), 8 (bench)")
    p.add_argument("--max-tokens", type=int, default=None, help="default: 256 (smollm2), 64 (bench)")
    p.add_argument("--steps", type=int, default=2, help="GRPO steps per engine; the last one is reported")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: every core)")
    p.add_argument("--skip-trl", action="store_true")
    p.add_argument("--sample-only", action="store_true", help="only the sampling part (no GRPO steps, no TRL)")
    p.add_argument("--repeats", type=int, default=1, help="timed sample calls per engine process (seeds 0, 1, ...)")
    p.add_argument("--rounds", type=int, default=1, help="sampling: hf and vllm processes this many times, alternating")
    p.add_argument("--bf16", action="store_true", help="TRL: bf16 autocast")
    p.add_argument("--child", choices=["sample", "step", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--engine", default="hf", help=argparse.SUPPRESS)
    p.add_argument("--model", default="", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps({"sample": child_sample, "step": child_step, "trl": child_trl}[a.child](a)))
        return
    a.threads = a.threads or len(os.sched_getaffinity(0))
    work = dict(zip(["prompts", "generations", "max_tokens"], SHAPE_WORK[a.shape], strict=True))
    for key, default in work.items():
        setattr(a, key, default if getattr(a, key) is None else getattr(a, key))
    name = {"smollm2": "SmolLM2-135M shape", "bench": "bench model (33.6M, Qwen2)"}[a.shape]
    with tempfile.TemporaryDirectory() as tmp:
        model = save_model(Path(tmp) / f"{a.shape}_shape", a.shape)
        print(f"work: {name}, {a.prompts} prompt(s) x G={a.generations}, <= {a.max_tokens} tokens, "
              f"{a.threads} thread(s); load average {os.getloadavg()[0]:.1f} (a shared CPU skews every figure)")  # fmt: skip
        results, rounds = {}, []
        for _ in range(a.rounds):  # alternating, so a drift of the machine hits both engines alike
            rounds.append({engine: run_child("sample", engine, model, a) for engine in ("hf", "vllm")})
            for engine, r in rounds[-1].items():
                print(f"sample {engine:4}: {json.dumps(r)}", flush=True)
        for engine in ("hf", "vllm"):
            results["sample", engine] = _pooled([r[engine] for r in rounds])
        for part, engine in [] if a.sample_only else [("step", "hf"), ("step", "vllm")]:
            results[part, engine] = r = run_child(part, engine, model, a)
            print(f"{part:6} {engine:4}: {json.dumps(r)}", flush=True)
        if not a.skip_trl and not a.sample_only:
            r = run_child("trl", "trl", model, a)
            print(f"step   TRL GRPOTrainer use_vllm colocate: {json.dumps(r)}", flush=True)
    _ratios(results)


def _pooled(runs: list[dict]) -> dict:
    """One engine's rounds together: tokens over seconds of every timed call, and the median call; the first
    failed round instead, if any."""
    failed = [r for r in runs if "tokens_per_s" not in r]
    if failed:
        return failed[0]
    per_call = sorted(x for r in runs for x in r["per_call"])
    tokens, seconds = (sum(r[k] for r in runs) for k in ("tokens", "seconds"))
    return {"tokens_per_s": tokens / seconds, "median_call": per_call[len(per_call) // 2], "calls": len(per_call)}


def _ratios(results: dict) -> None:
    hf, vllm = results["sample", "hf"], results["sample", "vllm"]
    if "tokens_per_s" in hf and "tokens_per_s" in vllm:
        ratio = hf["tokens_per_s"] / vllm["tokens_per_s"]
        print(f"sampling: hf {hf['tokens_per_s']:.1f} tok/s, vllm {vllm['tokens_per_s']:.1f} tok/s over every timed "
              f"call (median call {hf['median_call']} against {vllm['median_call']}, {hf['calls']} calls each): "
              f"hf x{ratio:.2f} vllm's")  # fmt: skip
    hf, vllm = results.get(("step", "hf"), {}), results.get(("step", "vllm"), {})
    if "step_s" in hf and "step_s" in vllm:
        ratio = hf["step_s"][-1] / vllm["step_s"][-1]
        print(f"GRPO step: hf {hf['step_s'][-1]:.1f} s, vllm {vllm['step_s'][-1]:.1f} s: x{ratio:.2f} faster (target >= 2)")


if __name__ == "__main__":
    main()
