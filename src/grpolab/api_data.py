"""GRPOTrainer's datasets as rows: a ``datasets.Dataset``, a list of dicts, or (as TRL takes them) a streamed
``IterableDataset``; an ``eval_dataset`` may also be a dict of them (a ``DatasetDict``), evaluated one by one.

A stream is read to a list, as grpolab samples from the rows it holds: for ``train_dataset`` only the rows the
run can use (``train.num_steps x train.prompts_per_step``, which TRL's ``max_steps`` sets; TRL requires it for a
stream), in the stream's order; an eval stream whole, as TRL's evaluation reads it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from grpolab.config import Config
from grpolab.data import DataError, examples_from_rows
from grpolab.types import Example


def is_stream(dataset: Any) -> bool:
    """A ``datasets.IterableDataset`` (told by its class, without importing datasets)."""
    return any(c.__name__ == "IterableDataset" for c in type(dataset).__mro__)


def dataset_rows(dataset: Any, name: str = "train_dataset", limit: int | None = None) -> list[dict[str, Any]]:
    """A ``datasets.Dataset``, a sequence of dicts or a stream (its first ``limit`` rows; all when None) as a list of
    rows; errors name the argument ``name``."""
    if isinstance(dataset, Mapping):  # a DatasetDict, or one row
        raise DataError(
            f"{name} is a mapping with keys {sorted(dataset)[:5]}: pass one split (e.g. dataset['train']) "
            "or a list of rows"
        )
    if is_stream(dataset):
        rows = list(itertools.islice(dataset, limit))
    elif hasattr(dataset, "to_list") and hasattr(dataset, "column_names"):  # datasets.Dataset
        rows = dataset.to_list()
    elif isinstance(dataset, Sequence) and not isinstance(dataset, str | bytes):
        rows = list(dataset)
    else:
        raise DataError(f"{name} is a {type(dataset).__name__}: give a datasets.Dataset, an IterableDataset or a list of dicts")
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise DataError(f"{name} row {i + 1} is a {type(row).__name__}; each row must be a dict of columns")
    if not rows:
        raise DataError(f"{name} holds no rows")
    for column in ("image", "images"):  # TRL's vision-language columns: a text model would train without them
        if any(r.get(column) not in (None, []) for r in rows):
            raise DataError(
                f"{name} has an '{column}' column: grpolab trains text models only and would leave the images out "
                "of every prompt (vision-language models are not supported, docs/trl.md); drop the column to "
                "train on the text alone"
            )
    return [dict(r) for r in rows]


def stream_limit(raw: Mapping[str, Any], train_dataset: Any) -> int | None:
    """The rows a run reads from a streamed train_dataset (None for any other dataset); a stream without
    ``train.num_steps`` is one line, as TRL requires ``max_steps`` for it."""
    if not is_stream(train_dataset):
        return None
    train = raw.get("train", {})
    if not train.get("num_steps"):
        raise DataError(
            "train_dataset is an IterableDataset, which has no length: set the run's length (TRL's max_steps, "
            "train.num_steps), as TRL requires"
        )
    return int(train["num_steps"]) * int(train.get("prompts_per_step") or Config().train.prompts_per_step)


def eval_sets(dataset: Any, cfg: Config) -> dict[str | None, list[Example]] | None:
    """An eval_dataset as examples by name: ``{None: examples}`` for one dataset, ``{name: examples}`` for a dict of
    them (TRL then logs each under ``eval_<name>_``); None for none."""
    if dataset is None:
        return None
    named = dataset if isinstance(dataset, Mapping) and not _is_row(dataset) else {None: dataset}
    return {
        name: examples_from_rows(dataset_rows(d, "eval_dataset" if name is None else f"eval_dataset[{name!r}]"), cfg.data,
                                 origin="eval_dataset")
        for name, d in named.items()
    }  # fmt: skip


def _is_row(mapping: Mapping[str, Any]) -> bool:
    """Not a dict of datasets (``datasets`` objects): one row given where a dataset belongs, which dataset_rows
    refuses."""
    return not all(hasattr(v, "column_names") or is_stream(v) for v in mapping.values())
