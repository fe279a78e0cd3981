"""Checkpoints that resume exactly: weights (safetensors), optimizer, scheduler, RNG and data position.

A checkpoint folder ``checkpoints/step_N`` is written under a temporary name (``.tmp_step_N``) and
renamed into place, so a kill during a write leaves the previous checkpoint intact; ``remove_partial``
deletes such leftovers (train() calls it at start). Only ``step_N`` folders are ever resumed from.
A kill between the rename and the pruning of old checkpoints leaves one checkpoint too many, pruned
by the next save. The weights are saved with
``save_pretrained`` (the adapter alone under LoRA), so a checkpoint is also a model folder that
``grpolab eval`` and ``from_pretrained`` can load.

Each checkpoint ends with ``manifest.json``: the size and SHA-256 of every file in it, written last
(files over ``HASH_LIMIT`` bytes get their size only: hashing tens of GB at every save would cost a
minute; a truncated file, the usual damage, still shows in its size).
``verify_checkpoint`` checks them on resume (a disk that filled up, a copy cut short, a file edited
by hand); ``latest_intact`` then falls back to the newest checkpoint that passes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import random
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from grpolab.errors import GrpolabError
from grpolab.models.loading import is_peft


class CheckpointError(GrpolabError, RuntimeError):
    """A checkpoint that cannot be written or read safely; the message says what to do."""

_STEP = re.compile(r"^step_(\d+)$")


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    root = checkpoint_root(run_dir)
    if not root.exists():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP.match(p.name)) and p.is_dir()]
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    run_dir: Path,
    step: int,
    *,
    model: torch.nn.Module,
    tokenizer,
    state: dict[str, Any],
    extra_models: dict[str, torch.nn.Module] | None = None,
    keep_last: int,
    files: dict[str, str] | None = None,
) -> Path:
    """Write checkpoints/step_<step> atomically and keep the newest ``keep_last``.

    ``state`` holds everything else that must resume (optimizer and scheduler state dicts, RNG
    states, data position, step); it is saved with torch.save. ``extra_models`` (a value head, a
    reset reference) are saved as <name>.safetensors; ``files`` are small text files (the config).
    """
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / f".tmp_step_{step}"
    with writing_checkpoint(tmp, run_dir):
        _write_files(tmp, model, tokenizer, state, extra_models or {}, files or {})
    trash = root / f".old_step_{step}"
    if final.exists():  # rewriting a step: move the old one aside first, so step_N is never half-deleted
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(final, trash)
    os.replace(tmp, final)
    _fsync_dir(root)
    shutil.rmtree(trash, ignore_errors=True)
    for _, old in list_checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _write_files(tmp: Path, model, tokenizer, state: dict, extra_models: dict, files: dict) -> None:
    from safetensors.torch import save_model

    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    for name, extra in extra_models.items():
        save_model(extra, str(tmp / f"{name}.safetensors"))
    torch.save(state, tmp / "trainer_state.pt")
    for name, text in files.items():
        (tmp / name).write_text(text)
    write_manifest(tmp)
    _fsync_dir(tmp)


def _write_errors() -> tuple[type[BaseException], ...]:
    """What a failed write raises: OSError, torch.save's RuntimeError, safetensors' SafetensorError."""
    from safetensors import SafetensorError

    return (OSError, RuntimeError, SafetensorError)


@contextlib.contextmanager
def writing_checkpoint(tmp: Path, run_dir: Path) -> Iterator[None]:
    """Around the writes into ``tmp``: a failure (a full disk: torch.save raises RuntimeError, safetensors
    its own error) removes the partial folder and becomes a CheckpointError naming the intact one."""
    try:
        yield
    except GrpolabError:
        raise
    except _write_errors() as err:
        shutil.rmtree(tmp, ignore_errors=True)
        free = shutil.disk_usage(tmp.parent).free if tmp.parent.exists() else 0
        last = latest_checkpoint(run_dir)
        kept = f"the previous checkpoint {last} is intact" if last else "no earlier checkpoint was written"
        raise CheckpointError(
            f"writing the checkpoint {tmp.name.removeprefix('.tmp_')} failed ({type(err).__name__}: "
            f"{' '.join(str(err).split())[:200]}) with {free / 2**20:.0f} MiB free on {tmp.parent}; {kept}. "
            "Free space (or choose another log.output_dir) and continue with grpolab train --resume"
        ) from err


MANIFEST = "manifest.json"
REQUIRED = ("trainer_state.pt",)
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors")
HASH_LIMIT = 2 << 30


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(folder: Path) -> None:
    """manifest.json: {relative path: {size, sha256}} of every file in ``folder``."""
    entries = {
        str(p.relative_to(folder)): {
            "size": p.stat().st_size,
            "sha256": _sha256(p) if p.stat().st_size <= HASH_LIMIT else None,
        }
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    (folder / MANIFEST).write_text(json.dumps({"files": entries}, indent=1) + "\n")


def verify_checkpoint(path: Path) -> str | None:
    """None when the checkpoint at ``path`` is intact; otherwise what is wrong with it.

    With a manifest: every file listed is there with its size and hash. Without one (an older
    checkpoint): the trainer state and the weights are present and the trainer state loads.
    """
    path = Path(path)
    manifest = path / MANIFEST
    if manifest.exists():
        try:
            entries = json.loads(manifest.read_text())["files"]
        except (ValueError, KeyError, TypeError, OSError):
            return f"{MANIFEST} is unreadable"
        for name, want in entries.items():
            file = path / name
            if not file.is_file():
                return f"{name} is missing"
            if file.stat().st_size != want["size"]:
                return f"{name} has {file.stat().st_size} bytes, {want['size']} were written"
            if want.get("sha256") is not None and _sha256(file) != want["sha256"]:
                return f"{name} does not match its checksum"
        for state in path.glob("trainer_state*.pt"):
            check_safe(state)  # intact, perhaps, but hostile: say so rather than call it damaged
        return None
    missing = [f for f in REQUIRED if not (path / f).is_file()]
    if not any((path / w).is_file() for w in WEIGHTS):
        missing.append(" or ".join(WEIGHTS))
    if missing:
        return f"{', '.join(missing)} missing"
    try:
        load_state(path)
    except CheckpointError:
        raise  # intact, perhaps, but unsafe to read: say so rather than call it damaged
    except Exception as err:  # noqa: BLE001 - any failure to unpickle means the file is damaged
        return f"trainer_state.pt does not load ({type(err).__name__})"
    return None


def latest_intact(run_dir: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(the newest intact checkpoint or None, [(damaged newer checkpoint, why)])."""
    damaged = []
    for _, path in reversed(list_checkpoints(run_dir)):
        problem = verify_checkpoint(path)
        if problem is None:
            return path, damaged
        damaged.append((path, problem))
    return None, damaged


def remove_partial(run_dir: Path) -> list[Path]:
    """Delete the ``.tmp_step_N`` / ``.old_step_N`` folders a killed save left behind; returns them."""
    root = checkpoint_root(run_dir)
    if not root.exists():
        return []
    partial = [p for p in root.iterdir() if p.name.startswith((".tmp_step_", ".old_step_"))]
    for p in partial:
        shutil.rmtree(p, ignore_errors=True)
    return partial


def load_weights_into(model: torch.nn.Module, path: Path) -> None:
    """Load a checkpoint's weights into an existing model in place (the optimizer keeps its parameters)."""
    if is_peft(model):
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(model, load_file(str(Path(path) / "adapter_model.safetensors")))
        return
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(path, dtype=next(model.parameters()).dtype)
    model.load_state_dict(loaded.state_dict())


def load_extra(module: torch.nn.Module, path: Path, name: str) -> bool:
    from safetensors.torch import load_model

    file = Path(path) / f"{name}.safetensors"
    if not file.exists():
        return False
    load_model(module, str(file))
    return True


def load_state(path: Path) -> dict[str, Any]:
    return safe_load(Path(path) / "trainer_state.pt")


def safe_load(file: Path) -> Any:
    """torch.load with weights_only=True: tensors and plain data only, so a crafted file cannot run code.

    Every trainer state grpolab writes (optimizer and scheduler state dicts, RNG states, counters) is
    such data. A file that holds anything else is refused with a CheckpointError.
    """
    try:
        return torch.load(file, weights_only=True)
    except pickle.UnpicklingError as err:
        raise _unsafe(file, _unsafe_globals(file)) from err


def check_safe(file: Path) -> None:
    """A CheckpointError if ``file`` names anything torch.load(weights_only=True) refuses; reads the
    pickle's opcodes only (no tensor data), so a checkpoint is judged before any model loads."""
    found = _unsafe_globals(file)
    if found:
        raise _unsafe(file, found)


def _unsafe_globals(file: Path) -> list[str]:
    try:
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(file))
    except Exception:  # noqa: BLE001 - a damaged file: the load that follows names the damage
        return []


def _unsafe(file: Path, found: list[str]) -> CheckpointError:
    named = f"it names {', '.join(found[:3])}" if found else "torch will not load it safely"
    return CheckpointError(
        f"{file} holds more than tensors and plain data ({named}); grpolab reads checkpoints with "
        "torch.load(weights_only=True) so that a crafted file cannot run code on --resume. It was edited or "
        "written by other software: resume from another checkpoint (move this one away) or start the run anew "
        "(log.overwrite=true)"
    )


def _fsync_dir(path: Path) -> None:
    for p in [path, *path.iterdir()] if path.is_dir() else [path]:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def weights_id(model: str) -> str:
    """A model's identity for a record of what was computed from it (claims' stage stamps): a local folder (or
    file) by its files' names, sizes and modification times, so that a model retrained into the same path (a
    checkpoint of the same step, written again) is another model; anything else (a hub id) by its name. Only
    stat() is read: no weights are hashed."""
    path = Path(model)
    if not path.exists():
        return model
    files = [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.is_file())
    digest = hashlib.sha256()
    for f in files:
        st = f.stat()
        digest.update(f"{f.relative_to(path) if f != path else f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return f"{model}@{digest.hexdigest()[:16]}"
