"""Typed, frozen, validated configuration.

A run is described by one ``Config``: nested dataclasses grouped by concern. YAML files give the
sections as mappings; dotted overrides (``algo.beta=0.0``) are applied on top. Every value is checked
against its declared type (``Literal`` choices included) before any model loads, and every error names
the key and says how to fix it. Derived quantities are properties, never fields mutated later.

Algorithm presets: ``algo.name`` picks a paper's recipe for the algo fields left as ``None`` (advantage
estimator, loss aggregation, KL, clip, updates per rollout, dynamic sampling, overlong filtering); see
``ALGO_PRESETS``. They are filled in when ``AlgoConfig`` is built, so every field holds its effective
value afterwards. Anything set explicitly wins. ``inert_settings`` lists valid settings that cannot act
or do less than expected; building a ``Config`` warns each as a ``ConfigWarning`` (config/checks.py).
"""

from __future__ import annotations

from grpolab.config.algo_section import (  # noqa: F401
    ALGO_PRESETS,
    AdvantageName,
    AlgoConfig,
    AlgoName,
    LossAgg,
    preset_algo,
)
from grpolab.config.checks import ConfigWarning  # noqa: F401
from grpolab.config.engine import VLLMConfig  # noqa: F401
from grpolab.config.inert import inert_settings  # noqa: F401
from grpolab.config.loading import (  # noqa: F401
    config_from_dict,
    config_to_dict,
    derive,
    dump_config,
    load_config,
    user_settings,
)
from grpolab.config.root import Config  # noqa: F401
from grpolab.config.run_sections import EvalConfig, LogConfig, OptimConfig, TrainConfig  # noqa: F401 - re-exported
from grpolab.config.sections import (  # noqa: F401 - re-exported
    DataConfig,
    LoraConfig,
    ModelConfig,
    ProcessRewardSpec,
    RewardConfig,
    RewardSpec,
    RolloutConfig,
)
from grpolab.config.stages import ClaimsConfig, IterativeConfig, RewardModelConfig, SFTConfig  # noqa: F401
from grpolab.errors import ConfigError  # noqa: F401
