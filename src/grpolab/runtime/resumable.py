"""Everything a checkpoint holds so that a resumed run continues exactly where it stopped: save and restore.

One process writes a single-file checkpoint (runtime/checkpoint.py); several processes, or FSDP, write a
DCP checkpoint from every rank (runtime/sharded.py). Restoring loads in place and returns the step; the
learning rate of the resuming config then applies (``--resume optim.lr=...``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpolab.algo.entropy_control import AdaptiveEntropy
from grpolab.config import Config, ConfigError, dump_config
from grpolab.data import PromptOrder
from grpolab.distributed import dist, parallel
from grpolab.models.loading import Reference
from grpolab.runtime import checkpoint as ckpt
from grpolab.runtime import sharded
from grpolab.runtime.guards import BadSteps, NoSignal
from grpolab.runtime.step_spec import critic_optim
from grpolab.training.optim import apply_optim_config
from grpolab.training.ppo import Critic

log = logging.getLogger(__name__)


@dataclass
class Resumable:
    """Everything a checkpoint must hold so that a resumed run continues exactly where it stopped."""

    model: Any
    tokenizer: Any
    optimizer: Any
    scheduler: Any
    reference: Reference | None
    data: PromptOrder
    sample_gen: torch.Generator
    minibatch_gen: torch.Generator
    critic: Critic | None
    bad_steps: BadSteps
    no_signal: NoSignal
    num_tokens: int = 0
    """Prompt + completion tokens trained on since step 1, over every rank (TRL's ``num_tokens``)."""
    entropy_control: AdaptiveEntropy | None = None
    """algo.entropy_adaptive's coefficient and last measured entropy (TRL: entropy_controller_state.json)."""

    @property
    def sharded(self) -> bool:
        """Several processes, or FSDP: DCP checkpoints written by every rank (runtime/sharded.py)."""
        return dist.world().size > 1 or parallel.is_sharded(self.model)

    def _dcp_parts(self, cfg: Config, step: int):
        models = {"model": self.model}
        optimizers = {"optimizer": (self.model, self.optimizer)}
        reset = cfg.algo.ref_reset_every
        if self.reference is not None and self.reference.frozen_model is not None and reset and step >= reset:
            models["reference"] = self.reference.frozen_model
        if self.critic is not None:
            models["value"] = self.critic.model
            optimizers["value_optimizer"] = (self.critic.model, self.critic.optimizer)
        return models, optimizers

    def save(self, cfg: Config, step: int) -> None:
        state = {
            "step": step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "data": self.data.state_dict(),
            "rng": ckpt.rng_state(),
            "sample_gen": self.sample_gen.get_state(),
            "minibatch_gen": self.minibatch_gen.get_state(),
            "bad_steps": self.bad_steps.state_dict(),
            "no_signal": self.no_signal.state_dict(),
            "num_tokens": self.num_tokens,
        }
        if self.entropy_control is not None:
            state["entropy_control"] = self.entropy_control.state_dict()
        if self.sharded:
            state.pop("optimizer")
            if self.critic is not None:
                state["critic"] = {k: v for k, v in self.critic.state_dict().items() if k != "optimizer"}
            models, optimizers = self._dcp_parts(cfg, step)
            sharded.save(
                cfg.run_dir, step, models=models, optimizers=optimizers, state=state,
                tokenizer=self.tokenizer, keep_last=cfg.log.keep_last,
            )
            return
        extra = {}
        if self.reference is not None and cfg.algo.ref_reset_every and step >= cfg.algo.ref_reset_every:
            extra["reference"] = self.reference.frozen_model
        if self.critic is not None:  # PPO: the value model and its optimizer resume with the rest
            extra["value"] = self.critic.model
            state["critic"] = self.critic.state_dict()
        ckpt.save_checkpoint(
            cfg.run_dir,
            step,
            model=parallel.unwrap(self.model),  # DDP over one process (torchrun --nproc_per_node 1) writes its module
            tokenizer=self.tokenizer,
            keep_last=cfg.log.keep_last,
            extra_models=extra,
            state=state,
            files={"config.yaml": dump_config(cfg)},  # what this checkpoint was trained with (runtime/resume.py)
        )

    def restore(self, path: Path, cfg: Config) -> int:
        """Load the checkpoint at ``path`` in place; returns its step. cfg's learning rate then applies."""
        if self.sharded:
            if not sharded.is_sharded_checkpoint(path):
                raise ConfigError(f"{path} is a one-process checkpoint; this job runs {dist.world().size} processes: resume it without torchrun")
            models, optimizers = self._dcp_parts(cfg, sharded.saved_step(path))
            state = sharded.load(path, models=models, optimizers=optimizers)
        else:
            if sharded.is_sharded_checkpoint(path):  # an FSDP run's: its weights are DCP shards
                raise ConfigError(f"{path} is a sharded checkpoint; resume it as it was run (torchrun / train.parallel), or export it (grpolab export)")
            ckpt.load_weights_into(parallel.unwrap(self.model), path)
            if self.reference is not None and self.reference.frozen_model is not None:
                ckpt.load_extra(self.reference.frozen_model, path, "reference")
            state = ckpt.load_state(path)
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        apply_optim_config(self.optimizer, self.scheduler, cfg.optim)  # --resume optim.lr=... takes effect
        self.data.load_state_dict(state["data"])
        ckpt.set_rng_state(state["rng"])
        self.sample_gen.set_state(state["sample_gen"])
        self.minibatch_gen.set_state(state["minibatch_gen"])
        self.bad_steps.load_state_dict(state.get("bad_steps", {}))
        self.no_signal.load_state_dict(state.get("no_signal", {}))
        self.num_tokens = int(state.get("num_tokens", 0))
        if self.entropy_control is not None and "entropy_control" in state:  # a run that had it (else: starts fresh)
            self.entropy_control.load_state_dict(state["entropy_control"])
        if self.critic is not None and self.sharded:
            self.critic.load_state_dict({**state["critic"], "optimizer": self.critic.optimizer.state_dict()})
        elif self.critic is not None:
            if not ckpt.load_extra(self.critic.model, path, "value") or "critic" not in state:
                raise ConfigError(
                    f"checkpoint {path} has no value model (value.safetensors): it was not a PPO run, so "
                    f"algo.name={cfg.algo.name} cannot resume it; resume with the run's own algo.name"
                )
            self.critic.load_state_dict(state["critic"])
        if self.critic is not None:
            apply_optim_config(self.critic.optimizer, self.critic.scheduler, critic_optim(cfg))
        log.info("resumed from %s at step %d", path, state["step"])
        return int(state["step"])


@dataclass
class SFTResumable:
    """What a stopped ``grpolab sft`` checkpoint holds (one process): weights, optimizer, the prompt order,
    the random states and the last dev accuracy, written and read like the RL checkpoint above."""

    model: Any
    tokenizer: Any
    optimizer: Any
    prompt_order: PromptOrder

    def save(self, cfg: Config, step: int, accuracy: float | None) -> None:
        state = {
            "step": step,
            "optimizer": self.optimizer.state_dict(),
            "data": self.prompt_order.state_dict(),
            "rng": ckpt.rng_state(),
            "accuracy": accuracy,
        }
        files = {"config.yaml": dump_config(cfg)}
        ckpt.save_checkpoint(
            cfg.sft_dir, step, model=self.model, tokenizer=self.tokenizer, state=state, keep_last=1, files=files
        )

    def restore(self, path: Path) -> tuple[int, float | None]:
        """Load a stopped run's checkpoint in place; (its step, its last dev accuracy)."""
        ckpt.load_weights_into(self.model, path)
        state = ckpt.load_state(path)
        self.optimizer.load_state_dict(state["optimizer"])
        self.prompt_order.load_state_dict(state["data"])
        ckpt.set_rng_state(state["rng"])
        log.info("sft: resumed from %s at step %d", path, state["step"])
        return int(state["step"]), state.get("accuracy")
