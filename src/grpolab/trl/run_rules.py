"""The rules for TRL's run-level fields (logging, checkpoints, evaluation, lengths, devices): the rest of
grpolab.trl.rules, which holds those that change what is trained."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpolab.trl.kinds import Refused
from grpolab.trl.rules import fraction_of_run, to_generation_steps

if TYPE_CHECKING:
    from grpolab.trl.convert import TrlView


# ----------------------------------------------------------------------------- logging and checkpoints


def output_dir(v: Any, t: TrlView) -> dict[str, Any]:
    if not v:
        return {}
    parent, _, name = str(v).rstrip("/").rpartition("/")
    if name in ("", ".", ".."):  # TRL writes into the folder itself; log.run_name must be a plain name
        folder = Path(v).resolve()
        parent, name = str(folder.parent), folder.name
    out = {"log.output_dir": parent or ".", "log.run_name": name}
    if t["run_name"] not in (None, name):
        t.note(f"run_name={t['run_name']!r}: grpolab names the tracker run after the run folder, {name!r}")
    return out


_TRACKERS = ("tensorboard", "wandb", "trackio")


def report_to(v: Any, t: TrlView) -> dict[str, Any]:
    names = [v] if isinstance(v, str) else list(v or [])
    if names in (["none"], []):
        return {"log.report_to": []}
    other = [n for n in names if n not in _TRACKERS]
    if other:
        raise Refused(f"report_to {other}: grpolab reports to {', '.join(_TRACKERS)}; list those by name")
    return {"log.report_to": names}


def project(v: Any, t: TrlView) -> dict[str, Any]:
    """TRL's project names the trackio project; open-r1's wandb_project, where a recipe gives one, the wandb
    project: grpolab's trackers share log.project, which takes wandb_project (TRL's default is "huggingface")."""
    wandb = t["wandb_project"]
    if wandb is None or wandb == v:
        return {"log.project": v}
    if v != "huggingface":
        t.note(f"project={v!r}, wandb_project={wandb!r}: grpolab's trackers share one project, log.project={wandb!r}")
    return {"log.project": wandb}


def save(v: Any, t: TrlView) -> dict[str, Any]:
    strategy = getattr(t["save_strategy"], "value", t["save_strategy"])
    if strategy == "no":
        t.note("save_strategy=no: grpolab still saves one checkpoint at the end")
        return {"log.checkpoint_every": 0}
    if strategy == "epoch":
        g = t.geometry
        if t.dataset_rows is None:
            t.todo("log.checkpoint_every: save_strategy=epoch; set it to the steps of one epoch (rows / "
                   "train.prompts_per_step) or pass --dataset-rows; until then grpolab saves at the end only")
            return {"log.checkpoint_every": 0}
        return {"log.checkpoint_every": max(1, math.ceil(t.dataset_rows / g.prompts_per_step))}
    if strategy != "steps":
        raise Refused(f"save_strategy={strategy}: grpolab saves every log.checkpoint_every steps (steps or epoch)")
    if v <= 0:
        raise Refused("save_steps must be > 0 with save_strategy=steps")
    if v < 1:
        v = fraction_of_run(t, v, "save_steps")
        if v is None:
            return {}
    return {"log.checkpoint_every": to_generation_steps(t, v, "save_steps")}


def keep(v: Any, t: TrlView) -> dict[str, Any]:
    if v is None:  # TRL keeps every checkpoint
        g = t.geometry
        if g.num_steps is None:
            t.todo("log.keep_last: TRL keeps every checkpoint (save_total_limit=None); grpolab keeps 2 by default")
            return {}
        return {"log.keep_last": max(1, g.num_steps)}
    return {"log.keep_last": max(1, v)}


def samples(v: bool, t: TrlView) -> dict[str, Any]:
    if not v:
        return {"log.samples_every": 0}
    every = t["logging_steps"]
    if 0 < every < 1:
        raise Refused("logging_steps < 1 (a fraction of the run): give logging_steps in optimizer steps")
    return {"log.samples_every": to_generation_steps(t, every, "logging_steps")}


def evaluation(v: Any, t: TrlView) -> dict[str, Any]:
    strategy = getattr(v, "value", v)
    if strategy == "no":
        return {"eval.every": 0}
    every = t["eval_steps"] or t["logging_steps"]  # transformers: eval_steps defaults to logging_steps
    if strategy != "steps" or every <= 0:
        raise Refused(f"eval_strategy={strategy}: grpolab evaluates every eval.every steps (eval_strategy=steps)")
    if every < 1:
        every = fraction_of_run(t, every, "eval_steps")
        if every is None:
            return {"eval.every": 0}
    t.todo("data.eval_size: grpolab evaluates Pass@K / Maj@K on held-out rows of the training data")
    return {
        "eval.every": to_generation_steps(t, every, "eval_steps"),
        "eval.num_samples": t["num_generations_eval"] or t["num_generations"],
    }


def max_length(v: Any, t: TrlView) -> dict[str, Any]:
    if v is None:
        raise Refused("max_completion_length=None: grpolab needs a bound (rollout.max_completion_length)")
    return {"rollout.max_completion_length": v}


def fsdp(v: Any, t: TrlView) -> dict[str, Any]:
    return {"train.parallel": "fsdp"} if v else {}


def dropout(v: bool, t: TrlView) -> dict[str, Any]:
    if not v:
        t.note("disable_dropout=False: grpolab keeps the model in eval mode (no dropout), as disable_dropout=True")
    return {}


def cpu(v: bool, t: TrlView) -> dict[str, Any]:
    return {"model.device": "cpu"} if v else {}

