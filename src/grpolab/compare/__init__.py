"""``grpolab compare``: GRPO against PPO (and others) on the same task, model, seed and sample budget.

The report puts the mission's claim in numbers: the models each algorithm loaded and their parameters,
peak memory, time per step by phase (generation, scoring, reference, training), and reward against
steps and against samples generated.
"""

from grpolab.compare.run import (
    DEFAULT_ALGOS,
    AlgoRun,
    CompareError,
    CompareStopped,
    Comparison,
    algo_config,
    compare,
    summarise,
    validate_algos,
)

__all__ = [
    "DEFAULT_ALGOS",
    "AlgoRun",
    "CompareError",
    "CompareStopped",
    "Comparison",
    "algo_config",
    "compare",
    "summarise",
    "validate_algos",
]
