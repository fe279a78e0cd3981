"""How ``grpolab claims`` runs a stage (studies/claims.py): announced and timed, stamped with what it read, and read
back rather than redone when a rerun would read the same; a training run's advice to resume turned into advice
that claims can take.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from grpolab import jsonio
from grpolab.commands.eval import evaluate
from grpolab.config import Config
from grpolab.config.view import config_view
from grpolab.errors import GrpolabError, one_line
from grpolab.eval.results import ModelEval, load_evals
from grpolab.runtime.checkpoint import weights_id
from grpolab.studies.child import in_child
from grpolab.studies.claims_data import ClaimsData

STAMP = "stage_config.yaml"
"""Beside a stage's output: the config sections it read and the weights it loaded (weights_id); a rerun with the
same sections and weights reads the output back (so a change to another experiment's settings does not redo
this one, and a model retrained upstream is measured again)."""


class ClaimsError(GrpolabError, RuntimeError):
    """A stage failed with advice that claims cannot follow as given; the message says what to do instead."""


SECONDS = "stage_seconds.json"
READ_BACK_S = 2.0
"""A stage done in less than this was read back: it keeps the seconds it took when it ran (SECONDS)."""


@contextlib.contextmanager
def timed(data: ClaimsData, name: str) -> Iterator[None]:
    """Announces the stage and records its seconds and load average in data.seconds / <run>/stage_seconds.json."""
    print(f"grpolab: claims: {name}", flush=True)
    path = data.cfg.run_dir / SECONDS
    saved = json.loads(path.read_text()) if path.is_file() else {}
    t0 = time.perf_counter()
    yield
    took = time.perf_counter() - t0
    if took >= READ_BACK_S or name not in saved:
        saved[name] = {"seconds": took, "load_average": os.getloadavg()[0]}
    data.seconds[name] = saved[name]["seconds"]
    data.loads[name] = saved[name]["load_average"]
    jsonio.write_whole(path, jsonio.dumps(saved, indent=1) + "\n")


@contextlib.contextmanager
def claims_advice() -> Iterator[None]:
    """A training run's refusal may advise ``grpolab train --resume``, which claims does not take: what to do here."""
    try:
        yield
    except GrpolabError as err:
        if "--resume" not in str(err):
            raise
        raise ClaimsError(
            f"{one_line(err)} [in grpolab claims, which takes no --resume: change the setting in the claims config "
            "and run the same command again; every stage that reads it is redone, the others are read back]"
        ) from err


def stage_text(cfg: Config, *extra: Any) -> str:
    """What an evaluation-like stage reads: the sections ``grpolab eval`` reads, and ``extra``."""
    return yaml.safe_dump({"config": config_view(cfg, "eval"), "extra": [str(x) for x in extra]}, sort_keys=False)


def stamped(folder: Path, text: str) -> bool:
    path = folder / STAMP
    return path.is_file() and path.read_text() == text


def stamp(folder: Path, text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    jsonio.write_whole(folder / STAMP, text)


def stage_eval(cfg: Config, model: str, label: str, folder: Path) -> ModelEval:
    """evaluate() of one model into ``folder``, or its eval.json read back when made with this config."""
    text = stage_text(cfg, weights_id(model), label)
    if stamped(folder, text) and (folder / "eval.json").is_file():
        [result] = load_evals(folder / "eval.json")
        return result
    in_child(f"claims' evaluation of {label}", _evaluate_into, cfg, model, label, folder)  # its memory returned
    [result] = load_evals(folder / "eval.json")
    stamp(folder, text)
    return result


def _evaluate_into(cfg: Config, model: str, label: str, folder: Path) -> None:
    evaluate(cfg, [model], labels=[label], out_dir=folder, progress=False)
