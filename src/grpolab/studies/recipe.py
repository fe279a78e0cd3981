"""A recipe end to end (``grpolab recipe -c CONFIG``, ``make real``): evaluate, train, evaluate, report.

1. Evaluate the starting model (``model.name_or_path``) on the held-out prompts: greedy accuracy,
   Pass@K and Maj@K at ``eval.temperature``.
2. GRPO (or the variant ``algo.name`` names) through ``grpolab.commands.train.train``.
3. Evaluate the final checkpoint the same way, on the same prompts and random stream.
4. Write ``<run>/report.md`` (the demo's report: curves, tables, samples) and ``<run>/eval.json``.

The config is checked and the model source resolved (a GGUF converted once, grpolab.models.sources)
before the first evaluation, so a bad config fails in seconds, not after the first evaluation.

``resume=True`` (``grpolab recipe --resume``) continues an interrupted recipe without redoing or deleting
anything done: the starting model's evaluation is read back from ``<run>/eval_base/eval.json`` when it
is there (it is written whole, after the evaluation), training continues from the latest checkpoint
(``grpolab train --resume``'s checks: the same config), and a training already at train.num_steps just
goes on to the final evaluation.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from grpolab.commands.eval import evaluate
from grpolab.commands.packaged import final_checkpoint, stop_if_interrupted
from grpolab.commands.train import train
from grpolab.config import Config
from grpolab.data import load_examples, split_eval
from grpolab.eval.report import summary_sentence, write_report
from grpolab.eval.results import ModelEval, load_evals, save_evals
from grpolab.models.sources import local_source
from grpolab.rewards import build_rewards
from grpolab.runtime.logging import read_metrics
from grpolab.runtime.preflight import check_model_source, prepare_run_dir

log = logging.getLogger(__name__)


@dataclass
class RecipeResult:
    run_dir: Path
    report: Path
    evals: list[ModelEval]
    final_checkpoint: Path
    seconds: dict[str, float]


def run_recipe(cfg: Config, *, title: str | None = None, resume: bool = False) -> RecipeResult:
    """Evaluate the model, train it, evaluate the result, write the report; see the module docstring."""

    prepare_run_dir(cfg, resume=resume)  # checkpoints without --resume or log.overwrite: fail now
    check_model_source(cfg.model)
    build_rewards(cfg.reward.functions)
    split_eval(load_examples(cfg.data, seed=cfg.seed), cfg.data.eval_size)  # a DataError now, not later
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    start_model = local_source(cfg.model.name_or_path)  # a GGUF: converted here, once
    seconds["convert"] = time.perf_counter() - t0
    run_dir = cfg.run_dir
    _phase(f"1/3 evaluating the starting model ({cfg.model.name_or_path})")
    t1 = time.perf_counter()
    saved = run_dir / "eval_base" / "eval.json"
    if resume and saved.is_file():  # done before the interruption: read back, not redone
        [before] = load_evals(saved)
        log.info("recipe --resume: the starting model's evaluation read back from %s", saved)
    else:
        [before] = evaluate(cfg, [start_model], labels=["base"], out_dir=run_dir / "eval_base")
    seconds["eval_base"] = time.perf_counter() - t1
    _phase(f"2/3 training: {cfg.train.num_steps} {cfg.algo.name.upper()} steps")
    t2 = time.perf_counter()
    trained = train(cfg, resume=resume)
    seconds["train"] = time.perf_counter() - t2
    stop_if_interrupted(trained)  # Ctrl-C during training: the checkpoint is saved, stop here
    final = final_checkpoint(trained)
    _phase(f"3/3 evaluating the trained model ({final})")
    t3 = time.perf_counter()
    [after] = evaluate(cfg, [str(final)], labels=[cfg.algo.name.upper()], out_dir=run_dir / "eval_final")
    seconds["eval_final"] = time.perf_counter() - t3
    evals = [before, after]
    save_evals(evals, run_dir / "eval.json")
    report = write_report(
        run_dir,
        evals,
        metrics_rows=read_metrics(trained.run_dir),
        setup=setup_lines(cfg, seconds),
        title=title or f"grpolab recipe: {cfg.log.run_name}",
    )
    seconds["total"] = time.perf_counter() - t0
    return RecipeResult(run_dir, report, evals, final, seconds)


def _phase(text: str) -> None:
    print(f"grpolab: {text}", flush=True)


def setup_lines(cfg: Config, seconds: dict[str, float]) -> dict[str, str]:
    t, r, e = cfg.train, cfg.rollout, cfg.eval
    return {
        "model": f"`{cfg.model.name_or_path}`",
        "task": f"data.source={cfg.data.source}, params {dict(cfg.data.params)}; {cfg.data.eval_size} held-out "
        f"prompts; chat template {'on' if cfg.data.chat_template else 'off'}",
        "reward": ", ".join(f"{s.name} {dict(s.kwargs)}" for s in cfg.reward.functions),
        cfg.algo.name.upper(): f"{t.num_steps} steps of {t.prompts_per_step} prompts x G={r.num_generations}, "
        f"lr {cfg.optim.lr:g}, beta {cfg.algo.beta:g}, mu {cfg.algo.mu}, T={r.temperature:g}, at most "
        f"{r.max_completion_length} tokens; {seconds['train']:.0f} s",
        "eval": f"greedy, and n={e.num_samples} samples per prompt at T={e.temperature:g} (unbiased pass@K, maj@K "
        f"over disjoint subsets); {seconds['eval_base']:.0f} s before, {seconds['eval_final']:.0f} s after",
    }


def print_summary(result: RecipeResult) -> None:

    before, after = result.evals
    k = max(set(before.ks) & set(after.ks))
    fmt = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
    print(f"{'':8s} {'greedy':>7s} {'pass@1':>7s} {f'maj@{k}':>7s} {f'pass@{k}':>7s}")
    for e in result.evals:
        print(f"{e.label:8s} {fmt(e.greedy_accuracy):>7s} {e.pass_at[1]:7.3f} {e.maj_at[k]:7.3f} {e.pass_at[k]:7.3f}")
    print(summary_sentence(before, after))
    times = ", ".join(f"{name} {s:.0f} s" for name, s in result.seconds.items())
    print(f"time: {times}; report: {result.report}")
