"""The config read into what a generation engine reads (``EngineSpec``, rollout/base.py): nothing in rollout/
reads the config.

``engine_spec`` is built once where a run, an evaluation or ``grpolab serve`` is put together, and handed to
``check_engine`` and ``build_sampler`` (rollout/engines.py); the engine's own section is the one its record
names (``EngineRecord.section``: ``vllm``).
"""

from __future__ import annotations

from grpolab.config import Config
from grpolab.rollout.base import EngineSpec
from grpolab.rollout.engines import ENGINES

__all__ = ["engine_spec"]


def engine_spec(cfg: Config) -> EngineSpec:
    """rollout.engine's spec: model.*, rollout.*, the engine's section, the seed, and the prompt and episode limits
    that bound one engine call. An engine without a record gets no section (``check_engine`` refuses it)."""
    record = ENGINES.get(cfg.rollout.engine)
    name = record.section if record is not None else None
    return EngineSpec(
        model=cfg.model,
        rollout=cfg.rollout,
        section=getattr(cfg, name) if name is not None else None,
        seed=cfg.seed,
        max_prompt_length=cfg.data.max_prompt_length,
        max_episode_tokens=cfg.env.max_episode_tokens if cfg.env.name is not None else 0,
    )
