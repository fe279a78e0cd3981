"""The held-out evaluation (eval/runner.py ``evaluate_model``) of the tiny model, in one process or as one rank
of a gloo job under train.sequence_parallel; used by test_sequence_parallel_eval.py.

Each rank records which samplers it built (rollout/engines.py: the hf engine's sampler, or the ``Onlooker``
of a rank that never samples) and how often it sampled or only took part."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from grpolab.rollout.base import Sampler


def overrides(model_dir: str, data: str) -> list[str]:
    return [
        f"model.name_or_path={model_dir}", "model.autocast=none", f"data.path={data}", "data.eval_size=5",
        "eval.num_samples=4", "eval.prompts_per_batch=2", "rollout.max_completion_length=4", "eval.correct_threshold=0.2",
        "reward.functions=[{name: 'toy_rewards:counted_digit_fraction'}]",
        "reward.gold=[{name: 'toy_rewards:digit_fraction', weight: 2.0}]", "log.progress=false",
    ]  # fmt: skip


class Recorded(Sampler):
    """A sampler whose ``sample`` and ``take_part`` calls are counted in ``calls``."""

    def __init__(self, inner: Sampler, calls: dict):
        self.inner, self.calls, self.pad_token_id = inner, calls, inner.pad_token_id
        calls.setdefault("built", []).append(type(inner).__name__)

    def sample(self, *args, **kwargs):
        self.calls["sample"] = self.calls.get("sample", 0) + 1
        return self.inner.sample(*args, **kwargs)

    def take_part(self) -> None:
        self.calls["take_part"] = self.calls.get("take_part", 0) + 1
        self.inner.take_part()

    def update_weights(self, model) -> None:
        self.inner.update_weights(model)

    def close(self) -> None:
        self.inner.close()


def run_eval(model_dir: str, data: str, n: int, mode: str = "none") -> dict:
    """``evaluate_model`` of the tiny model on the 5 held-out prompts (train.sequence_parallel=n), the policy as
    training holds it (``mode``: train.parallel, "fsdp": sampled with its layers gathered); the result as a
    dict, with this rank's sampler calls."""
    from grpolab.commands.eval import held_out_examples
    from grpolab.config import load_config
    from grpolab.data import tokenize_prompts
    from grpolab.distributed import parallel
    from grpolab.eval.runner import evaluate_model
    from grpolab.rollout.engines import build_sampler
    from grpolab.runtime.assemble import load_model
    from grpolab.runtime.engine_spec import engine_spec
    from grpolab.runtime.eval_spec import build_grader, eval_spec

    cfg = load_config(None, [*overrides(model_dir, data), f"train.sequence_parallel={n}"])
    torch.manual_seed(cfg.seed)
    model, tok = load_model(cfg.model)
    wrapped = parallel.wrap(model, mode, torch.device("cpu"))
    examples = held_out_examples(cfg)
    calls: dict = {}

    def make(temperature: float) -> Sampler:
        inner = build_sampler(engine_spec(cfg), policy=model, tokenizer=tok, autocast_dtype=None, wrapped=wrapped, temperature=temperature)
        return Recorded(inner, calls)

    result = evaluate_model(
        wrapped, make, tokenize_prompts(examples, tok, cfg.data), examples, build_grader(cfg), eval_spec(cfg),
        label="tiny", path=model_dir, progress=False,
    )  # fmt: skip
    out = dataclasses.asdict(result)
    out.pop("seconds")
    return {"eval": out, "calls": calls}


def worker(rank: int, world: int, port: int, model_dir: str, data: str, out: str, n: int, modes: tuple) -> None:
    """A rank of the job (torch.multiprocessing.spawn); rank 0 saves every rank's ``run_eval`` of each mode."""
    os.environ.update(
        {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
         "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)}
    )  # fmt: skip
    torch.set_num_threads(1)
    from grpolab.distributed import dist, sequence

    results = {}
    with dist.session("cpu", timeout_s=120), sequence.sequence_parallel(n, timeout_s=120):
        for mode in modes:
            every = [None] * world
            torch.distributed.all_gather_object(every, run_eval(model_dir, data, n, mode))
            results[mode] = every
        if dist.is_main():
            torch.save(results, Path(out))
