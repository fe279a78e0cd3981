"""What ``grpolab claims`` measured (ClaimsData), the names of its runs, and the setup line under every
figure and verdict. studies/claims.py fills the data stage by stage; studies/claims_report.py reads it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpolab.config import Config
from grpolab.distributed.host import describe_cpu
from grpolab.eval.results import ModelEval
from grpolab.models.loading import cpu_has_bf16_matmul


@dataclass
class ClaimsData:
    """Everything the report reads (studies/claims.py fills it stage by stage)."""

    cfg: Config
    """The user's config (model.name_or_path: the original model, before any warm start)."""
    start_model: str
    """The model folder every experiment starts from: the warm-started model, or the original one."""
    original_model: str | None = None
    """With claims.warm_start: the original model's folder (evaluated as "original")."""
    warm_start: dict[str, Any] = field(default_factory=dict)
    """With claims.warm_start: its record (studies/claims_start.warm_start); {} without."""
    evals: dict[str, ModelEval] = field(default_factory=dict)
    """"A/base", "A/GRPO", "B/base", "B/GRPO", "A/original", ... (Pass@K / Maj@K); "greedy/base_s0",
    "greedy/G4_s0", ... (greedy only, per seed)."""
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Training run name (run_name: grpo_s0, ppo_s1, grpo_G4_s2) -> compare.summarise's row, with its metrics
    rows under "rows"."""
    kl: dict[str, dict[str, float]] = field(default_factory=dict)
    """Policy name -> eval.kl.KLMeasure as a dict."""
    reward_model: dict[str, Any] = field(default_factory=dict)
    """The preference pairs' counts and train-rm's history."""
    hacking_runs: dict[str, str] = field(default_factory=dict)
    """Run name -> run folder: the runs on the reward model and the rule-reward contrast."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Stage -> seconds it took when it ran (a stage read back keeps them)."""
    loads: dict[str, float] = field(default_factory=dict)
    """Stage -> the 1-minute load average at its end: what else ran on the machine."""


def grpo_name(g: int) -> str:
    return f"grpo_G{g}"


def run_name(name: str, seed: int) -> str:
    """A training run's folder: its experiment's name and its seed (grpo_s0, ppo_s1, grpo_G4_s2)."""
    return f"{name}_s{seed}"


def seeds(cfg: Config) -> list[int]:
    """claims.seeds seeds from cfg.seed on; the first is the seed of claims 3, 4 and 5."""
    return [cfg.seed + i for i in range(cfg.claims.seeds)]


def g_run(cfg: Config, g: int, seed: int) -> str:
    """The run of claim 2 at group size ``g``: claim 1's GRPO run at rollout.num_generations."""
    return run_name("grpo" if g == cfg.rollout.num_generations else grpo_name(g), seed)


def setup_line(cfg: Config, warm_start: dict[str, Any] | None = None) -> str:
    """Model, warm start, task, steps, seeds, engine, dtype and CPU: under every figure and verdict."""
    t, r = cfg.train, cfg.rollout
    bf16 = cfg.model.autocast == "bf16" or (cfg.model.autocast == "auto" and cpu_has_bf16_matmul())
    dtype = f"{cfg.model.dtype} weights, {'bf16 autocast' if bf16 else 'no autocast'}"
    engine = r.engine
    if r.engine == "vllm":  # vllm.dtype auto: the trainer's autocast dtype, else model.dtype (docs/vllm.md)
        weights = cfg.vllm.dtype if cfg.vllm.dtype != "auto" else "bfloat16" if bf16 else cfg.model.dtype
        engine += f" ({weights} weights)"
    warm = ""
    if warm_start:
        errors = warm_start.get("dev_format_errors")
        warm = (f"; warm start {warm_start['steps']} SFT steps (budget {warm_start['budget']}), greedy dev format "
                f"errors {'n/a' if errors is None else format(errors, '.3f')} (target {warm_start['target_format_errors']:g})")
    seed_list = seeds(cfg)
    return (
        f"`{cfg.model.name_or_path}`{warm}; data.source={cfg.data.source} {dict(cfg.data.params)}; {t.num_steps} "
        f"steps of {t.prompts_per_step} prompts x G={r.num_generations}, lr {cfg.optim.lr:g}, beta {cfg.algo.beta:g}; "
        f"seed{'s' if len(seed_list) > 1 else ''} {', '.join(map(str, seed_list))}; engine {engine}; {dtype}; "
        f"{describe_cpu()}"
    )
