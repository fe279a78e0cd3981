"""The embedded default (``grpolab demo``): DeepSeekMath in miniature on a CPU, in minutes.

1. Build a character tokenizer and a tiny Qwen2 model in code; save them (``<run>/init_model``).
2. SFT from scratch until greedy dev accuracy reaches ``sft.target_accuracy``: a mediocre policy that
   sometimes succeeds, as RL needs (docs/algorithms.md 6.0). Saved to ``<run>/sft``.
3. GRPO from that folder through ``grpolab.commands.train.train``, the path a user's model takes.
4. Evaluate both models on the held-out prompts: Pass@K and Maj@K up to K = eval.num_samples.
5. Write ``<run>/report.md`` with plots, and print a summary.

Every stage reads one config, ``grpolab/configs/demo.yaml`` (design B: 3-digit addition, normal order),
with the size preset's overrides and the caller's on top; only the model path changes between stages.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpolab.commands.eval import evaluate
from grpolab.commands.packaged import final_checkpoint, packaged_config, stop_if_interrupted, with_model
from grpolab.commands.sft import sft
from grpolab.commands.train import train
from grpolab.config import Config, derive
from grpolab.eval.report import summary_sentence, write_report
from grpolab.eval.results import ModelEval
from grpolab.models.loading import count_parameters
from grpolab.runtime.demo_folder import claim
from grpolab.runtime.logging import read_metrics
from grpolab.tasks.tiny import save_tiny

# size -> (tiny-model shape, config overrides). "tiny" is for tests: seconds, not a result.
SIZES: dict[str, tuple[dict[str, int], list[str]]] = {
    "full": ({"hidden_size": 128, "num_layers": 2, "num_heads": 4}, []),
    "tiny": (
        {"hidden_size": 32, "num_layers": 1, "num_heads": 2},
        [
            "data.size=600",
            "data.eval_size=6",
            "sft.steps=4",
            "sft.batch_size=16",
            "sft.check_every=2",
            "sft.dev_size=8",
            "train.num_steps=2",
            "train.prompts_per_step=4",
            "rollout.num_generations=4",
            "eval.num_samples=8",
            "eval.prompts_per_batch=4",
        ],
    ),
}


@dataclass
class DemoResult:
    run_dir: Path
    report: Path
    evals: list[ModelEval]
    sft_steps: int
    sft_accuracy: float | None
    seconds: dict[str, float]


def demo_config(out_dir: str | Path, size: str = "full", overrides: Sequence[str] = ()) -> Config:
    """The demo config (package data) with the size preset, the output folder and ``overrides`` applied."""
    return packaged_config("demo.yaml", SIZES, out_dir, size, overrides)


def run_demo(
    out_dir: str | Path = "runs/demo", size: str = "full", overrides: Sequence[str] = ()
) -> DemoResult:
    """SFT a tiny model from scratch, GRPO it, evaluate before and after, write the report."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the demo shows its own bars, one per phase
    base = own_config(demo_config(out_dir, size, overrides), "demo")
    run_dir, seconds = base.run_dir, {}
    t0 = time.perf_counter()
    init = save_tiny(run_dir / "init_model", seed=base.seed, **SIZES[size][0])
    sft_result = sft(with_model(base, init), resume=True)  # continues an SFT a Ctrl-C stopped
    stop_if_interrupted(sft_result)  # Ctrl-C during SFT: its checkpoint is saved, stop here
    seconds["sft"] = time.perf_counter() - t0
    grpo_cfg = with_model(base, str(base.sft_dir))
    t1 = time.perf_counter()
    trained = train(grpo_cfg)
    seconds["grpo"] = time.perf_counter() - t1
    stop_if_interrupted(trained)  # Ctrl-C during GRPO: the checkpoint is saved, stop here
    final = final_checkpoint(trained)
    t2 = time.perf_counter()
    evals = evaluate(grpo_cfg, [str(base.sft_dir), str(final)], labels=["SFT", "GRPO"])
    seconds["eval"] = time.perf_counter() - t2
    report = write_report(
        run_dir,
        evals,
        metrics_rows=read_metrics(trained.run_dir),
        setup=_setup_lines(grpo_cfg, init, sft_result, seconds),
        title=f"grpolab demo: GRPO in miniature ({_task_name(grpo_cfg)})",
    )
    seconds["total"] = time.perf_counter() - t0
    return DemoResult(run_dir, report, evals, sft_result.steps, sft_result.dev_accuracy, seconds)


def own_config(cfg: Config, kind: str) -> Config:
    """``cfg`` after claiming its run folder (runtime/demo_folder.py): the demo's own earlier run there is
    started over (log.overwrite), any other run refused unless log.overwrite=true was given."""
    claim(cfg.run_dir, kind, overwrite=cfg.log.overwrite)
    return derive(cfg, {"log.overwrite": True})


def _task_name(cfg: Config) -> str:
    order = "sum reversed" if cfg.data.params.get("reverse", True) else "sum in normal order"
    return f"{cfg.data.params.get('digits', 3)}-digit addition, {order}"


def _setup_lines(cfg: Config, init: str, sft_result, seconds: dict[str, float]) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    params = count_parameters(AutoModelForCausalLM.from_pretrained(init))
    s, t, r = cfg.sft, cfg.train, cfg.rollout
    acc = "n/a" if sft_result.dev_accuracy is None else f"{sft_result.dev_accuracy:.3f}"
    return {
        "task": f"{_task_name(cfg)}, exact-match reward; "
        f"{cfg.data.eval_size} held-out prompts",
        "model": f"Qwen2 architecture built in code, {params:,} parameters, character tokenizer",
        "SFT": f"{sft_result.steps} steps of batch {s.batch_size}, lr {s.lr:g}; stopped at greedy dev accuracy "
        f"{acc} (target {s.target_accuracy}); {seconds['sft']:.0f} s",
        "GRPO": f"{t.num_steps} steps of {t.prompts_per_step} prompts x G={r.num_generations}, lr {cfg.optim.lr:g}, "
        f"beta {cfg.algo.beta:g}, mu {cfg.algo.mu}, T={r.temperature:g}; {seconds['grpo']:.0f} s",
        "eval": f"n={cfg.eval.num_samples} samples per prompt at T={cfg.eval.temperature:g}, unbiased pass@K, "
        f"maj@K over disjoint subsets; {seconds['eval']:.0f} s",
    }


def print_summary(result: DemoResult) -> None:
    """A terminal summary: the before/after numbers and where the report is."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    before, after = result.evals[0], result.evals[-1]
    table = Table(title="Pass@K / Maj@K on held-out prompts")
    table.add_column("")
    for k in before.ks:
        table.add_column(f"K={k}", justify="right")
    for e in result.evals:
        table.add_row(f"{e.label} pass@K", *(f"{e.pass_at[k]:.3f}" for k in e.ks))
        table.add_row(f"{e.label} maj@K", *(f"{e.maj_at[k]:.3f}" for k in e.ks))
    console.print(table)
    fmt = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
    console.print(
        f"SFT: {result.sft_steps} steps, greedy dev accuracy {fmt(result.sft_accuracy)}. Greedy held-out "
        f"accuracy {fmt(before.greedy_accuracy)} -> {fmt(after.greedy_accuracy)}."
    )
    console.print(summary_sentence(before, after))
    times = ", ".join(f"{k} {v:.0f} s" for k, v in result.seconds.items())
    console.print(f"Time: {times}. Report: [bold]{result.report}[/bold]")
