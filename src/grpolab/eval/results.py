"""What evaluating one model produces, as plain data that round-trips through JSON (no torch here)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpolab import jsonio


@dataclass
class ModelEval:
    """Pass@K / Maj@K curves and summary numbers of one model on the held-out prompts."""

    label: str
    """Short name shown in tables and plots (e.g. "SFT", "GRPO")."""
    path: str
    """The model folder or hub id evaluated."""
    num_prompts: int
    num_samples: int
    """n completions sampled per prompt."""
    temperature: float
    pass_at: dict[int, float]
    """K -> mean unbiased pass@K."""
    maj_at: dict[int, float]
    """K -> mean maj@K (majority vote over disjoint subsets of K samples)."""
    greedy_accuracy: float | None = None
    mean_length: float = 0.0
    """Mean sampled completion length in tokens (EOS included)."""
    reward_mean: float = 0.0
    """Mean total reward of the sampled completions."""
    seconds: float = 0.0
    samples: list[dict[str, Any]] = field(default_factory=list)
    """A few prompts with their reference, greedy completion and some sampled completions."""
    gold_mean: dict[str, float] = field(default_factory=dict)
    """reward.gold: mean of each gold reward (and "gold_total") over the sampled completions; {} without."""
    per_prompt: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    """{"pass": {K: [pass@K of each prompt]}, "maj": {...}}, prompts in held-out order: what an interval over
    prompts resamples (grpolab.eval.intervals); {} in files written before it existed."""
    blind_grader: str | None = None
    """eval.blind_grader: the format-blind grading of the blind_* fields; None = none (they are empty)."""
    blind_pass_at: dict[int, float] = field(default_factory=dict)
    """K -> mean pass@K when the blind grader decides what is right."""
    blind_maj_at: dict[int, float] = field(default_factory=dict)
    """K -> mean maj@K under the blind grader (its vote keys: eval.metrics.blind_vote_keys)."""
    blind_per_prompt: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    """As per_prompt, under the blind grader."""
    format_error_share: float | None = None
    """Share of the sampled completions that failed on format (eval.metrics.format_errors)."""
    greedy_blind_accuracy: float | None = None
    """Greedy accuracy under the blind grader."""
    greedy_format_error_share: float | None = None
    """Share of the greedy completions that failed on format."""

    @property
    def ks(self) -> list[int]:
        return sorted(self.pass_at)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for curve in ("pass_at", "maj_at", "blind_pass_at", "blind_maj_at"):
            data[curve] = {str(k): v for k, v in getattr(self, curve).items()}
        for per in ("per_prompt", "blind_per_prompt"):
            data[per] = {kind: {str(k): v for k, v in by_k.items()} for kind, by_k in getattr(self, per).items()}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelEval:
        """Read back; the fields a file written before them lacks take their defaults."""
        data = dict(data)
        for curve in ("pass_at", "maj_at", "blind_pass_at", "blind_maj_at"):
            data[curve] = {int(k): float(v) for k, v in data.get(curve, {}).items()}
        data["gold_mean"] = {k: math.nan if v is None else v for k, v in data.get("gold_mean", {}).items()}
        for per in ("per_prompt", "blind_per_prompt"):
            data[per] = {
                kind: {int(k): [float(x) for x in v] for k, v in by_k.items()} for kind, by_k in data.get(per, {}).items()
            }
        return cls(**data)


def save_evals(evals: list[ModelEval], path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    jsonio.write_whole(path, jsonio.dumps([e.to_json() for e in evals], indent=1) + "\n")  # flushed, then renamed
    return path


def load_evals(path: Path) -> list[ModelEval]:
    return [ModelEval.from_json(d) for d in json.loads(Path(path).read_text())]
