"""reasoning-gym procedural datasets as grpolab Examples, and the reward that uses their own scorers.

``reasoning_gym`` is imported lazily: it takes about a second and registers 100+ datasets.
Each Example's ``meta`` holds the dataset name, seed, size and params next to the entry, so the
``gym_score`` reward can rebuild the exact dataset object whose ``score_answer(answer, entry)`` grades
it (some scorers read the dataset's config), in this process or another one.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Mapping
from typing import Any

from grpolab.rewards.base import PerSample, per_sample
from grpolab.rewards.rules import extract_answer_tag
from grpolab.config.templates import apply_template, resolve_template
from grpolab.types import Completion, Example

ANSWER_INSTRUCTION = "Give only the final answer between <answer> and </answer> tags."

_DATASETS: dict[tuple, Any] = {}


def gym_dataset_names() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def _key(name: str, seed: int, size: int, params: Mapping[str, Any]) -> tuple:
    return (name, seed, size, json.dumps(dict(params), sort_keys=True, default=repr))


def gym_dataset(name: str, *, size: int, seed: int, params: Mapping[str, Any] | None = None) -> Any:
    """The (cached) ``reasoning_gym`` dataset; errors name close matches or the accepted params."""
    params = dict(params or {})
    key = _key(name, seed, size, params)
    if key in _DATASETS:
        return _DATASETS[key]
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        close = difflib.get_close_matches(name, DATASETS, n=5, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ValueError(
            f"reasoning-gym has no dataset {name!r}; {hint}see grpolab.tasks.reasoning_gym.gym_dataset_names() "
            f"for all {len(DATASETS)}"
        )
    try:
        dataset = reasoning_gym.create_dataset(name, size=size, seed=seed, **params)
    except (TypeError, ValueError, AssertionError) as exc:
        fields = [f.name for f in dataclasses.fields(DATASETS[name][1]) if f.name not in ("seed", "size")]
        raise ValueError(
            f"reasoning-gym dataset {name!r} rejected params {params}: {exc}; "
            f"its params are: {', '.join(fields)}"
        ) from exc
    _DATASETS[key] = dataset
    return dataset


def gym_examples(
    name: str,
    *,
    size: int,
    seed: int,
    params: Mapping[str, Any] | None = None,
    template: str = "r1",
    system_prompt: str | None = None,
    answer_instruction: str = ANSWER_INSTRUCTION,
) -> list[Example]:
    """``size`` Examples of reasoning-gym dataset ``name``, questions put in ``template``.

    ``template`` is a ``TEMPLATES`` key or text with ``{prompt}``. When the template does not ask
    for ``<answer>`` tags itself (e.g. "none"), ``answer_instruction`` is appended to the question.
    """
    params = dict(params or {})
    dataset = gym_dataset(name, size=size, seed=seed, params=params)
    asks_for_tags = "<answer>" in resolve_template(template)
    examples = []
    for index in range(size):
        entry = dataset[index]
        question = entry["question"].strip()
        if not asks_for_tags and answer_instruction:
            question = f"{question}\n{answer_instruction}"
        meta = {
            "gym_dataset": name,
            "gym_seed": seed,
            "gym_size": size,
            "gym_params": params,
            "gym_index": index,
            "gym_entry": entry,
        }
        examples.append(
            Example(apply_template(template, question, system_prompt), str(entry["answer"]), meta)
        )
    return examples


def gym_score(completion: Completion, example: Example) -> float:
    """The dataset's own ``score_answer`` on the last ``<answer>`` after the reasoning (None if absent)."""
    meta = example.meta
    missing = [k for k in ("gym_dataset", "gym_seed", "gym_size", "gym_entry") if k not in meta]
    if missing:
        raise ValueError(
            f"example meta lacks {', '.join(missing)}; the reasoning_gym reward grades only examples "
            "made by grpolab.tasks.reasoning_gym.gym_examples"
        )
    dataset = gym_dataset(
        meta["gym_dataset"], size=meta["gym_size"], seed=meta["gym_seed"], params=meta.get("gym_params")
    )
    return dataset.score_answer(extract_answer_tag(completion.text), meta["gym_entry"])


def make_gym_score() -> PerSample:
    return per_sample(gym_score, name="reasoning_gym")
