"""Skywork-OR1's adaptive entropy control (arXiv 2505.22312, Sec. 3.2; TRL's use_adaptive_entropy).

The entropy bonus's coefficient c follows the policy's entropy H, measured once per optimizer step over the
tokens the policy loss counts (every rank's): after the step, ``c <- min(c + delta, c_max)`` when H is at or
below the target, else ``max(c - delta, c_min)``. A step applies c only when the entropy measured at the
previous step was at or below the target (the bonus switches off while the policy explores enough), and the
first step, with nothing measured yet, applies none. These are TRL 1.16's rules (grpo_trainer.py,
``_compute_loss``), gate included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["AdaptiveEntropy"]


@dataclass
class AdaptiveEntropy:
    """The controller's settings and its state (``coef``, ``last_entropy``), which a checkpoint keeps."""

    coef: float
    """The coefficient now: algo.entropy_coef at the start, then moved after every optimizer step."""
    target: float
    """algo.entropy_target: the mean per-token entropy (nats) the control holds the policy at."""
    delta: float
    """algo.entropy_coef_delta: the coefficient's change per optimizer step."""
    coef_min: float = 0.0
    """algo.entropy_coef_min."""
    coef_max: float = 1.0
    """algo.entropy_coef_max."""
    last_entropy: float = math.inf
    """The entropy measured at the last optimizer step (inf before the first: no bonus yet)."""

    def applied(self) -> float:
        """The coefficient the next optimizer step's loss uses: ``coef``, or 0 while the entropy is above the target."""
        return self.coef if self.last_entropy <= self.target else 0.0

    def observe(self, entropy: float) -> None:
        """After an optimizer step: its mean per-token entropy moves the coefficient for the next one."""
        if entropy <= self.target:
            self.coef = min(self.coef + self.delta, self.coef_max)
        else:
            self.coef = max(self.coef - self.delta, self.coef_min)
        self.last_entropy = entropy

    def state_dict(self) -> dict[str, float]:
        return {"coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.coef, self.last_entropy = float(state["coef"]), float(state["last_entropy"])
