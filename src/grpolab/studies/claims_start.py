"""``grpolab claims``, stage 0: the warm start on the task's answer format (``claims.warm_start``).

DeepSeekMath's Fig. 7 compares its Instruct model, already supervised to answer in format, before and after
RL (arXiv 2402.03300, Sec. 5.2.2). A model whose failures are mostly of format leaves RL a win that says
nothing about sharpening: fixing the format raises Pass@K at every K. So the claims start where the paper's
model started: ``grpolab sft`` on the task's answers (the ``sft:`` section; ``sft.completion_format`` is the
format), stopped once the share of format errors among its greedy dev replies is at most
``sft.target_format_errors`` (commands/sft.py), ``sft.steps`` its budget. The saved model is the start of
every later stage: the evaluations "before", the RL runs and their reference, the KL and the reward model.

Where it departs from the paper: DeepSeekMath-Instruct had a full instruction-tuning stage (776K examples);
here the warm start teaches the one task's answer format, for as few steps as it takes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import yaml

from grpolab.commands.sft import sft
from grpolab.config import Config, ConfigError, config_to_dict, derive

RESULT = "sft_result.json"


def warm_start_config(cfg: Config) -> Config:
    """The SFT of stage 0: cfg's ``sft:`` section from model.name_or_path, into ``<run>/warm_start_<digest>``.

    The digest is of every setting the warm start reads, so a changed one trains a new model in a new folder,
    and each later stage, whose stamp names the model's folder, is redone rather than read back."""
    full = config_to_dict(cfg)
    reads = {key: full[key] for key in ("model", "data", "sft", "reward", "seed")}
    reads["sft"] = {k: v for k, v in reads["sft"].items() if k != "output_dir"}
    reads["decode"] = {
        "rollout": {k: full["rollout"][k] for k in ("engine", "max_completion_length")},
        "eval": {k: full["eval"][k] for k in ("blind_grader", "correct_threshold")},
        "micro_batch_size": full["train"]["micro_batch_size"],
    }
    digest = hashlib.sha256(yaml.safe_dump(reads, sort_keys=True).encode()).hexdigest()[:10]
    return derive(cfg, {"sft.output_dir": str(cfg.run_dir / f"warm_start_{digest}"), "log.progress": False})


def check_warm_start(cfg: Config) -> None:
    """What stage 0 needs, checked before any model loads."""
    if cfg.claims.warm_start and cfg.sft.target_format_errors is None:
        raise ConfigError(
            "claims.warm_start needs sft.target_format_errors, the share of format errors among the greedy dev "
            "replies at which the warm start stops (e.g. sft.target_format_errors=0.05); sft.steps is its budget"
        )


def warm_start(cfg: Config) -> tuple[Config, dict[str, Any]]:
    """Run (or read back) the warm start; (cfg with model.name_or_path the warm-started model, its record).

    The record: steps taken, the budget, the greedy dev accuracy and format-error share at the end, the
    target, whether it was reached, and the folder. An interrupted warm start (SIGINT / SIGTERM) keeps its
    checkpoint and raises KeyboardInterrupt; the next ``grpolab claims`` continues it."""
    sft_cfg = warm_start_config(cfg)
    folder = sft_cfg.sft_dir
    if not ((folder / RESULT).is_file() and (folder / "config.json").is_file()):
        done = sft(sft_cfg, resume=True)
        if done.stopped_by is not None:
            raise KeyboardInterrupt
    result = json.loads((folder / RESULT).read_text())
    errors, target = result.get("dev_format_errors"), cfg.sft.target_format_errors
    record = {
        "steps": result["steps"],
        "budget": cfg.sft.steps,
        "dev_size": cfg.sft.dev_size,
        "dev_greedy_accuracy": result["dev_greedy_accuracy"],
        "dev_format_errors": errors,
        "target_format_errors": target,
        "reached": errors is not None and target is not None and errors <= target,
        "seconds": result["seconds"],
        "path": str(folder),
    }
    return derive(cfg, {"model.name_or_path": str(folder)}), record
