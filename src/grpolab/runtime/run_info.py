"""run_info.json: which models a run loaded and how many parameters each holds, written at start.

The count is the mission's central claim made visible: PPO loads policy, reference, reward and value;
GRPO the same less the value model. ``null`` means the model was not loaded (beta = 0: no reference;
rule rewards: no reward model); a reference of 0 parameters is LoRA's adapter-disabled base (no copy).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from grpolab import jsonio
from grpolab.config import Config
from grpolab.models.loading import count_parameters
from grpolab.distributed import dist


def _reward_parameters(rewards: Sequence[Any]) -> int | None:
    """Parameters of the neural reward models among the rewards (their ``num_parameters``, or the modules
    they hold); None when every reward is a rule."""
    counts = []
    for weighted in rewards:
        inner = getattr(weighted, "reward", weighted)
        n = getattr(inner, "num_parameters", None)
        modules = [v for v in getattr(inner, "__dict__", {}).values() if isinstance(v, torch.nn.Module)]
        if isinstance(n, int):
            counts.append(n)
        elif modules:
            counts.append(sum(count_parameters(m) for m in modules))
    return sum(counts) if counts else None


def model_inventory(policy, reference, critic, rewards: Sequence[Any]) -> dict[str, Any]:
    """{"policy", "policy_trainable", "reference", "reward", "value"}: parameter counts, None = not loaded."""
    ref = None
    if reference is not None:
        ref = 0 if reference.frozen_model is None else count_parameters(reference.frozen_model)
    return {
        "policy": count_parameters(policy),
        "policy_trainable": count_parameters(policy, trainable_only=True),
        "reference": ref,
        "reward": _reward_parameters(rewards),
        "value": None if critic is None else count_parameters(critic.model),
    }


def write_run_info(
    cfg: Config, *, policy, reference, critic, rewards: Sequence[Any], baseline_mem_mb: float, device: torch.device
) -> dict[str, Any]:
    """Write <run_dir>/run_info.json and return what was written."""
    info = {
        "algo": cfg.algo.name,
        "device": str(device),
        "dtype": cfg.model.dtype,
        "models": model_inventory(policy, reference, critic, rewards),
        "reward_functions": [getattr(r, "name", repr(r)) for r in rewards],
        "baseline_mem_mb": baseline_mem_mb,
    }
    info["world_size"] = dist.world().size
    if dist.is_main():
        Path(cfg.run_dir, "run_info.json").write_text(jsonio.dumps(info, indent=2) + "\n")
    return info
