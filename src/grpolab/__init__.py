"""grpolab: GRPO (DeepSeekMath, arXiv 2402.03300) and the PPO it is a variant of, for causal LMs.

The top-level names are imported lazily so that ``import grpolab.algo`` stays free of transformers.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GRPOTrainer", "evaluate", "load_config", "run_demo", "sft", "train"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "load_config":
        from grpolab.config import load_config

        return load_config
    if name == "train":  # the Python API (api.py); grpolab.commands.train.train is the loop it runs
        from grpolab.api import train

        return train
    if name == "GRPOTrainer":
        from grpolab.api import GRPOTrainer

        return GRPOTrainer
    if name == "sft":
        from grpolab.commands.sft import sft

        return sft
    if name == "evaluate":
        from grpolab.eval.runner import evaluate

        return evaluate
    if name == "run_demo":
        from grpolab.commands.demo import run_demo

        return run_demo
    raise AttributeError(f"module 'grpolab' has no attribute {name!r}")
