"""Sharded checkpoints of a torchrun job (torch.distributed.checkpoint, DCP), and their export.

A job of several processes (or any FSDP job) writes ``checkpoints/step_N/`` as:

    dcp/                      every rank writes its shards of the models and optimizers (DCP format)
    trainer_state_rank<r>.pt  each rank's scheduler, RNG, sampling-generator and data-position state
    config.json, tokenizer    the model's config and tokenizer (rank 0), for ``grpolab export``
    sharded.json              the world size, so a resume at another world size fails with a message

Atomic like the one-process checkpoint (run/checkpoint.py): all ranks write into ``.tmp_step_N``,
wait for each other (barrier), then rank 0 renames it into place and prunes old ones. Exact resume
needs the same world size (each rank's generators and data share are its own).

``export(checkpoint, out)`` turns one into a plain Hugging Face folder (safetensors + config +
tokenizer) in one process: ``dcp_to_torch_save`` gathers the full tensors.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from grpolab.errors import GrpolabError
from grpolab.runtime import checkpoint as ckpt
from grpolab.distributed import dist
from grpolab.distributed.parallel import unwrap

MARKER = "sharded.json"


class ExportError(GrpolabError, RuntimeError):
    """A checkpoint that cannot be exported; the message says why."""


def is_sharded_checkpoint(path: Path) -> bool:
    return (Path(path) / MARKER).exists()


def saved_step(path: Path) -> int:
    return int(_marker(path)["step"])


def saved_world_size(path: Path) -> int:
    return int(_marker(path)["world_size"])


def _marker(path: Path) -> dict[str, Any]:
    try:
        data = json.loads((Path(path) / MARKER).read_text())
        return {"step": int(data["step"]), "world_size": int(data["world_size"])}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ExportError(f"{path}/{MARKER} is unreadable ({type(err).__name__}: {err}); the checkpoint is damaged") from err


def _state(models: dict[str, nn.Module], optimizers: dict[str, tuple[nn.Module, Any]]) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    out: dict[str, Any] = {name: get_model_state_dict(m) for name, m in models.items()}
    for name, (m, opt) in optimizers.items():
        out[name] = get_optimizer_state_dict(m, opt)
    return out


def save(
    run_dir: Path,
    step: int,
    *,
    models: dict[str, nn.Module],
    optimizers: dict[str, tuple[nn.Module, Any]],
    state: dict[str, Any],
    tokenizer,
    keep_last: int,
) -> Path:
    """Write checkpoints/step_<step> from every rank; ``models["model"]`` is the policy.

    ``optimizers`` maps a name to (the module it optimises, the optimizer); ``state`` is this rank's.
    """
    import torch.distributed.checkpoint as dcp

    root = ckpt.checkpoint_root(run_dir)
    tmp, final = root / f".tmp_step_{step}", root / f"step_{step}"
    if dist.is_main():
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    dcp.save(_state(models, optimizers), checkpoint_id=str(tmp / "dcp"))
    rank = dist.world().rank
    torch.save(state, tmp / f"trainer_state_rank{rank}.pt")
    if dist.is_main():
        unwrap(models["model"]).config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps({"world_size": dist.world().size, "step": step}) + "\n")
    dist.barrier()  # every rank's files are written: only now may the folder become step_N
    if dist.is_main():
        ckpt.write_manifest(tmp)  # sizes and hashes, verified on resume (run/checkpoint.py)
        trash = root / f".old_step_{step}"
        if final.exists():
            shutil.rmtree(trash, ignore_errors=True)
            os.replace(final, trash)
        os.replace(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
        for _, old in ckpt.list_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def load(
    path: Path, *, models: dict[str, nn.Module], optimizers: dict[str, tuple[nn.Module, Any]]
) -> dict[str, Any]:
    """Load the shards into ``models`` and ``optimizers`` in place; returns this rank's trainer state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    path = Path(path)
    saved = saved_world_size(path)
    if saved != dist.world().size:
        raise GrpolabError(
            f"{path} was written by {saved} processes, this job has {dist.world().size}: resume with "
            f"--nproc_per_node/--nnodes giving {saved} processes, or export it (grpolab export) and start anew"
        )
    state = _state(models, optimizers)
    dcp.load(state, checkpoint_id=str(path / "dcp"))
    for name, m in models.items():
        set_model_state_dict(m, state[name])
    for name, (m, opt) in optimizers.items():
        set_optimizer_state_dict(m, opt, state[name])
    return ckpt.safe_load(path / f"trainer_state_rank{dist.world().rank}.pt")


def export(checkpoint: Path, out: Path, *, dtype: str | None = None) -> Path:
    """A Hugging Face model folder at ``out`` from the sharded checkpoint ``checkpoint`` (one process)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    checkpoint, out = Path(checkpoint), Path(out)
    check_export(checkpoint, out)
    config = AutoConfig.from_pretrained(checkpoint)
    with tempfile.TemporaryDirectory() as tmp:
        full = Path(tmp) / "full.pt"
        try:
            dcp_to_torch_save(checkpoint / "dcp", full)
        except Exception as err:  # noqa: BLE001 - DCP raises CheckpointException, OSError, ValueError...
            raise ExportError(
                f"{checkpoint}: the shards cannot be read ({type(err).__name__}: {' '.join(str(err).split())[:200]}); "
                "the checkpoint is damaged: export an earlier one"
            ) from err
        weights = ckpt.safe_load(full)["model"]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if k not in _tied(model)]
    if missing or unexpected:
        raise ExportError(
            f"{checkpoint}: the saved weights do not fit {config.model_type} (missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}); a LoRA run's checkpoint holds base + adapter and is not exported here"
        )
    if dtype:
        model = model.to(getattr(torch, dtype))
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(checkpoint).save_pretrained(out)
    if not (out / "config.json").is_file() or not any((out / w).is_file() for w in ckpt.WEIGHTS):
        raise ExportError(f"{out}: nothing was written (no config.json and weights there); check the folder")
    return out


def check_export(checkpoint: Path, out: Path) -> None:
    """Before any work: the checkpoint is sharded and intact, and ``out`` is a new or empty folder outside
    every run's checkpoints folder (a model there would be taken for a checkpoint, and pruned or resumed)."""
    if not is_sharded_checkpoint(checkpoint):
        raise ExportError(
            f"{checkpoint} is not a sharded checkpoint (no {MARKER}); a one-process checkpoint is already a "
            "model folder that from_pretrained loads"
        )
    has_manifest = (checkpoint / ckpt.MANIFEST).is_file()
    problem = ckpt.verify_checkpoint(checkpoint) if has_manifest else None
    if not (checkpoint / "dcp" / ".metadata").is_file():
        problem = problem or "dcp/.metadata is missing"
    if problem is not None:
        raise ExportError(f"{checkpoint} is damaged ({problem}); export an earlier checkpoint of the run")
    target = out.expanduser().resolve()
    for folder in (target, *target.parents):
        if folder.name == "checkpoints" and (ckpt.list_checkpoints(folder.parent) or folder == checkpoint.resolve().parent):
            raise ExportError(
                f"export target {out} is inside the run's checkpoints folder {folder}: there it would be pruned "
                "by keep_last or taken for a checkpoint on --resume. Export to a folder outside it"
            )
    if target.exists() and not target.is_dir():
        raise ExportError(f"export target {out} is a file; give a folder to write the model into")
    if target.is_dir() and any(target.iterdir()):
        raise ExportError(f"export target {out} is a folder that already holds files; give a new or empty folder")


def _tied(model: nn.Module) -> set[str]:
    """Names of parameters tied to another (the output head to the embeddings), restored by tying."""
    names = getattr(model, "_tied_weights_keys", None) or {}
    return set(names) if not isinstance(names, dict) else set(names)
