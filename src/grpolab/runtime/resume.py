"""An honest --resume: the checkpoint is intact, and the config differs from the saved one only where it may.

``resume_point(cfg)`` picks the newest checkpoint that passes ``verify_checkpoint`` (a damaged newer
one is named in a warning; none intact is an error), then compares ``cfg`` with the config saved in
that checkpoint (``config.yaml`` inside it, else the run's), field by field:

* a change of what was trained (the model, tokenizer, data, G, prompts per step, the algorithm and
  its loss, the rewards, the seed, the schedule's shape...) is refused with a message naming every
  such field, unless the user allows it explicitly (``--resume-allow-change KEY`` on the command line,
  or ``log.resume_allow=[KEY, ...]``; a section name allows the whole section);
* a change in ``ACCEPTED`` (learning rate, step count, clipping, logging, checkpoint cadence, ...)
  goes through: it takes effect (``training.optim.apply_optim_config`` rebuilds the learning rates after
  the optimizer and scheduler state are loaded) and is recorded, in the log and as a row of
  ``<run_dir>/resumes.jsonl``; config.yaml is then rewritten with the new values.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grpolab import jsonio
from grpolab.config import Config, ConfigError, config_from_dict, config_to_dict
from grpolab.distributed import dist
from grpolab.runtime import checkpoint as ckpt
from grpolab.runtime import sharded

log = logging.getLogger(__name__)

ACCEPTED = (
    "optim.lr",
    "optim.weight_decay",
    "optim.max_grad_norm",
    "train.num_steps",
    "train.micro_batch_size",
    "train.max_bad_steps",
    "train.max_no_signal_steps",
    "train.max_failed_group_share",
    "train.offload_activations",
    "reward.timeout_s",
    "reward.dry_run_examples",
    "reward.max_retries",
    "env.max_retries",
    "model.device",
    "model.gradient_checkpointing",
    "rollout.max_batch_sequences",
    "rollout.engine",
    "vllm.gpu_memory_utilization",
    "vllm.kv_cache_space_gb",
    "vllm.max_model_len",
    "vllm.max_num_seqs",
    "vllm.enable_prefix_caching",
    "vllm.enforce_eager",
    "vllm.sleep_mode",
    "log",
    "eval",
    "sft",
    "reward_model",
    "iterative",
)
"""Keys (or whole sections) a resume may change without asking: they do not alter what was trained."""


@dataclass
class ResumePoint:
    path: Path
    """The checkpoint to load."""
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    """key -> (saved value, new value) of every field that differs."""


def _matches(key: str, prefixes) -> bool:
    return any(key == p or key.startswith((p + ".", p + "[")) for p in prefixes)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """{"optim.lr": 1e-3, ...}; lists (reward.functions) are compared whole."""
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): data}


def _saved_config(run_dir: Path, checkpoint: Path) -> tuple[dict[str, Any] | None, Path]:
    for path in (checkpoint / "config.yaml", run_dir / "config.yaml"):
        if path.is_file():
            try:
                raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            except (yaml.YAMLError, UnicodeDecodeError, OSError) as err:
                raise ConfigError(f"--resume: the saved config {path} cannot be read ({err})") from err
            try:  # normalised as the new one is (defaults of fields added since, tuples as lists)
                return config_to_dict(config_from_dict(raw)), path
            except ConfigError:
                return raw, path
    return None, run_dir / "config.yaml"


def config_changes(saved: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    old, cur = flatten(saved), flatten(new)
    return {k: (old.get(k), cur.get(k)) for k in sorted(set(old) | set(cur)) if old.get(k) != cur.get(k)}


def check_changes(changes: dict[str, tuple[Any, Any]], allow: tuple[str, ...], saved_path: Path) -> None:
    refused = {k: v for k, v in changes.items() if not _matches(k, ACCEPTED) and not _matches(k, allow)}
    if not refused:
        return
    listed = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
    keys = " ".join(f"--resume-allow-change {k}" for k in refused)
    raise ConfigError(
        f"--resume would change what the run was trained with ({listed}; saved in {saved_path}). Resume "
        f"with the saved values, start a new run (another log.run_name), or if you mean it pass {keys}"
    )


def intact_checkpoint(folder: Path, label: str, fix: str = "") -> Path | None:
    """The newest intact checkpoint under ``folder`` (None when it holds none). When every one is damaged, a
    ConfigError naming each and why; damaged newer ones are skipped with a warning. Used by every verb that
    resumes (train, sft), so they judge a checkpoint alike."""
    if not ckpt.list_checkpoints(folder):
        return None
    path, damaged = ckpt.latest_intact(folder)
    if path is None:
        why = "; ".join(f"{p.name}: {problem}" for p, problem in damaged)
        raise ConfigError(f"{label}: no intact checkpoint in {ckpt.checkpoint_root(folder)} ({why}){fix}")
    for bad, problem in damaged:
        log.warning("%s: checkpoint %s is damaged (%s); resuming from %s instead", label, bad, problem, path)
    return path


def resume_point(cfg: Config) -> ResumePoint | None:
    """The checkpoint to resume from and the accepted config changes; None when the run has none yet."""
    run_dir = cfg.run_dir
    fix = "; start over with log.overwrite=true or restore the checkpoints from a copy"
    path = intact_checkpoint(run_dir, "--resume", fix)
    if path is None:
        log.warning("--resume: no checkpoint in %s, starting from step 0", run_dir)
        return None
    check_world_size(path)
    saved, saved_path = _saved_config(run_dir, path)
    if saved is None:
        log.warning("--resume: %s has no saved config to compare with; trusting the given one", run_dir)
        return ResumePoint(path)
    changes = config_changes(saved, config_to_dict(cfg))
    check_changes(changes, cfg.log.resume_allow, saved_path)
    return ResumePoint(path, changes)


def check_world_size(path: Path) -> None:
    """A sharded checkpoint resumes only with the world size that wrote it (each rank's RNG and data share
    are its own); a ConfigError before any model loads says how to run it."""
    if not sharded.is_sharded_checkpoint(path):
        return
    saved = sharded.saved_world_size(path)
    if saved != dist.world().size:
        raise ConfigError(
            f"--resume: {path} is a sharded checkpoint written by {saved} processes and this job has "
            f"{dist.world().size}: resume it with torchrun --nproc_per_node={saved} (same config), or export it "
            f"(grpolab export {path} <folder>) and start a new run from that folder"
        )


def record_resume(cfg: Config, point: ResumePoint, step: int) -> None:
    """Log the accepted changes and append them to <run_dir>/resumes.jsonl."""
    changes = {k: {"saved": old, "now": new} for k, (old, new) in point.changes.items() if k != "log.resume_allow"}
    for key, change in changes.items():
        log.warning("--resume: %s changed from %r to %r (takes effect from step %d)", key, change["saved"],
                    change["now"], step + 1)
    row = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "checkpoint": str(point.path), "step": step,
           "changes": changes}
    with Path(cfg.run_dir, "resumes.jsonl").open("a", encoding="utf-8") as fh:
        fh.write(jsonio.dumps(row, default=str) + "\n")
