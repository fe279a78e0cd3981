"""What the packaged runs share (``grpolab demo``, ``demo --agent``, ``recipe``): a packaged config read with
its size preset and output folder, a config pointed at another model folder, a run's final checkpoint."""

from __future__ import annotations

import importlib.resources
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpolab.commands.train import TrainResult
from grpolab.config import Config, derive, load_config
from grpolab.runtime.checkpoint import checkpoint_root

Sizes = Mapping[str, tuple[dict[str, int], list[str]]]
"""size name -> (the tiny model's shape, the config overrides of that size)."""


def packaged_config(name: str, sizes: Sizes, out_dir: str | Path, size: str, overrides: Sequence[str]) -> Config:
    """``grpolab/configs/<name>`` (package data) with the size's overrides, the output folder and ``overrides``."""
    if size not in sizes:
        raise ValueError(f"unknown demo size {size!r}; choose one of {', '.join(sizes)}")
    out = Path(out_dir)
    where = [f"log.output_dir={out.parent}", f"log.run_name={out.name}"]
    resource = importlib.resources.files("grpolab") / "configs" / name
    with importlib.resources.as_file(resource) as path:
        return load_config(path, [*sizes[size][1], *where, *overrides])


def with_model(cfg: Config, path: str | Path) -> Config:
    """The same config with model.name_or_path set (re-validated like any loaded config)."""
    return derive(cfg, {"model.name_or_path": str(path)})


def final_checkpoint(trained: TrainResult) -> Path:
    """The checkpoint of a finished run's last step, which the demos and the recipe evaluate."""
    return checkpoint_root(trained.run_dir) / f"step_{trained.final_step}"


def stop_if_interrupted(result: Any) -> None:
    """A phase (SFT, training) that a signal stopped after its checkpoint ends the whole packaged run."""
    if result.stopped_by is not None:
        raise KeyboardInterrupt
