"""``grpolab eval``: Pass@K / Maj@K of one or more model folders on the held-out prompts (DeepSeekMath Fig. 7).

Each path is checked (and the prompts against its tokenizer) before any model loads; each model is then
loaded as training loads it (runtime/assemble.py) and evaluated by ``grpolab.eval.runner.evaluate_model``.
``eval.json`` is rewritten after each model, so a stop during the next one keeps the results so far.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

import torch

from grpolab.config import Config, ConfigError
from grpolab.data import DataError, check_prompt_chars, tokenize_prompts
from grpolab.distributed import dist
from grpolab.eval.report import plot_pass_maj
from grpolab.eval.results import ModelEval, save_evals
from grpolab.eval.runner import Grader, evaluate_model
from grpolab.models.loading import load_tokenizer, resolve_device
from grpolab.rollout.engines import check_engine
from grpolab.runtime.assemble import load_model, split_examples
from grpolab.runtime.engine_spec import engine_spec
from grpolab.runtime.eval_spec import build_grader, eval_spec, sampler_maker
from grpolab.runtime.judges import judges_served
from grpolab.runtime.preflight import check_model_source
from grpolab.types import Example

log = logging.getLogger(__name__)


def held_out_examples(cfg: Config) -> list[Example]:
    """The fixed held-out examples (data.eval_size, at most eval.max_prompts), never drawn for training."""
    if cfg.data.eval_size < 1:
        raise DataError("evaluation needs held-out prompts: set data.eval_size (e.g. 300)")
    _, held_out = split_examples(cfg)
    return held_out[: cfg.eval.max_prompts] if cfg.eval.max_prompts else held_out


def evaluate(
    cfg: Config,
    checkpoints: Sequence[str] | None = None,
    *,
    labels: Sequence[str] | None = None,
    out_dir: str | Path | None = None,
    progress: bool | None = None,
) -> list[ModelEval]:
    """Evaluate each model folder (default: eval.checkpoints, else model.name_or_path); write JSON and a plot.

    Writes ``<out_dir>/eval.json`` (all models) and ``<out_dir>/pass_maj.png``; returns the results.
    """
    paths = list(checkpoints or cfg.eval.checkpoints or [cfg.model.name_or_path])
    names = list(labels) if labels else [_label(p) for p in paths]
    if len(names) != len(paths):
        raise ConfigError(f"{len(names)} labels for {len(paths)} checkpoints: give one label per checkpoint")
    out = Path(out_dir) if out_dir is not None else cfg.eval_dir
    show = cfg.log.progress if progress is None else progress
    with dist.session(resolve_device(cfg.model).type, **dist.session_options(cfg.train)):
        return _evaluate(cfg, paths, names, out, show)


def _model_configs(cfg: Config, paths: list, examples: list[Example]) -> list:
    """One model config per path, every path checked (and the prompts against its tokenizer) before any
    model loads: a mistyped third path must not cost the first two evaluations."""
    configs = []
    for path in paths:
        model_cfg = dataclasses.replace(
            cfg.model, name_or_path=str(path), lora=dataclasses.replace(cfg.model.lora, enabled=False)
        )
        check_model_source(model_cfg)
        check_prompt_chars(examples, load_tokenizer(model_cfg), cfg.data)
        configs.append(model_cfg)
    return configs


def _evaluate(cfg: Config, paths: list, names: list, out: Path, show: bool) -> list[ModelEval]:
    grader = build_grader(cfg)
    examples = held_out_examples(cfg)
    check_engine(cfg.rollout.engine, engine_spec(cfg))  # before any model loads (vllm: the architecture, the KV cache)
    configs = _model_configs(cfg, paths, examples)
    with judges_served(cfg, [*grader.rewards, *grader.gold]):  # a judge with serve: its server, for the grading
        return _evaluate_all(cfg, paths, names, out, show, grader, examples, configs)


def _evaluate_all(cfg: Config, paths: list, names: list, out: Path, show: bool, grader: Grader, examples, configs) -> list[ModelEval]:
    results, spec = [], eval_spec(cfg)
    for path, label, model_cfg in zip(paths, names, configs, strict=True):
        torch.manual_seed(cfg.seed)
        model, tok = load_model(model_cfg)
        prompt_ids = tokenize_prompts(examples, tok, cfg.data)
        result = evaluate_model(
            model, sampler_maker(cfg, model, tok), prompt_ids, examples, grader, spec, label=label, path=str(path),
            progress=show,
        )
        log.info("eval %s: pass@1 %.3f, greedy %.3f", label, result.pass_at[1], result.greedy_accuracy or 0.0)
        results.append(result)
        del model
        if dist.is_main():  # after each model: a stop during the next one keeps these results
            save_evals(results, out / "eval.json")
    if dist.is_main():
        plot_pass_maj(results, out / "pass_maj.png")
    return results


def _label(path: str) -> str:
    p = Path(path)
    return f"{p.parent.parent.name}/{p.name}" if p.parent.name == "checkpoints" else p.name or str(path)
