"""Model objects in the Python API: a loaded ``PreTrainedModel`` or ``PeftModel`` as ``model=``, and
``save_model`` / ``state.log_history`` after training, as TRL's GRPOTrainer has them.

A model object is written once, with ``save_pretrained``, to a temporary folder that the trainer owns
(removed with the trainer), and the run loads it from there as it loads any folder: the dtype, the chunked
LM head, the reference and the generation engine are then built exactly as from a folder, and vLLM, which
loads a folder, sees the same weights. A ``PeftModel`` is written as its base model plus its adapter, and
the adapter is trained (``model.lora.enabled``). The run's config.yaml names the temporary folder; its
checkpoints hold the trained weights.

What cannot be taken from an object is refused with the reason, when the trainer is made: a model already
wrapped for parallel training (DDP, FSDP, DeepSpeed: grpolab wraps the policy itself, ``train.parallel``), a
compiled one, a quantized one or one whose config carries a quantization config (the run would load it
quantized: grpolab does not train quantized weights), one on the meta device, and PEFT adapters other
than one LoRA adapter. ``save_model`` refuses a folder inside the run's own checkpoints folder, which the
next training of the run prunes or deletes.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpolab.api_args import lora_targets
from grpolab.errors import ConfigError, GrpolabError
from grpolab.runtime.checkpoint import checkpoint_root, latest_intact
from grpolab.runtime.sharded import export

_DTYPES = {"torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16"}
_WRAPPERS = {
    "DistributedDataParallel": "DistributedDataParallel",
    "DataParallel": "DataParallel",
    "FullyShardedDataParallel": "FSDP",
    "DeepSpeedEngine": "DeepSpeed",
    "OptimizedModule": "torch.compile",
}
# what a checkpoint holds beside the model (runtime/checkpoint.py): left out of save_model's folder
_NOT_MODEL = ("trainer_state", "manifest.json", "config.yaml")


@dataclass
class ModelFolder:
    """Where a model object was written, and the model.* keys that load it from there."""

    path: Path
    keys: dict[str, Any]
    """model.* keys: name_or_path, tokenizer, dtype and, for a PeftModel, lora."""
    base_name: str | None = None
    """A PeftModel's base_model_name_or_path as it was given (written back by save_model)."""
    _cleanup: Any = field(default=None, repr=False)


def model_folder(model: Any, tokenizer: Any, owner: object) -> ModelFolder:
    """Check ``model`` (and ``tokenizer``, an object, a folder / hub id, or None) and write it to a temporary
    folder removed with ``owner``; ConfigError with the reason for what cannot be taken."""
    _check_object(model)
    peft = hasattr(model, "peft_config") and hasattr(model, "get_base_model")
    base = model.get_base_model() if peft else model
    dtype = _DTYPES.get(str(base.dtype))
    if dtype is None:
        raise ConfigError(f"model's weights are {base.dtype}: grpolab trains float32, bfloat16 or float16 weights")
    lora = _lora_of(model) if peft else None  # before anything is written
    token_source = _tokenizer_source(tokenizer, base)
    path = Path(tempfile.mkdtemp(prefix="grpolab-model-"))
    cleanup = weakref.finalize(owner, shutil.rmtree, path, True)
    try:
        folder = _write(model, base, path, peft, tokenizer, token_source)
    except (OSError, ValueError, RuntimeError) as err:
        cleanup()
        raise ConfigError(f"model could not be written to a folder for the run ({type(err).__name__}: {err})") from err
    keys: dict[str, Any] = {"name_or_path": str(folder), "tokenizer": token_source or str(path / "base" if peft else path)}
    keys["dtype"] = dtype
    if lora is not None:
        keys["lora"] = lora
    base_name = getattr(next(iter(model.peft_config.values())), "base_model_name_or_path", None) if peft else None
    return ModelFolder(path, keys, base_name, cleanup)


def tokenizer_folder(tokenizer: Any, owner: object) -> ModelFolder:
    """A tokenizer object (processing_class) written to a temporary folder removed with ``owner``."""
    path = Path(tempfile.mkdtemp(prefix="grpolab-tokenizer-"))
    cleanup = weakref.finalize(owner, shutil.rmtree, path, True)
    try:
        tokenizer.save_pretrained(path)
    except (OSError, ValueError, TypeError) as err:
        cleanup()
        raise ConfigError(f"processing_class could not be written to a folder ({type(err).__name__}: {err})") from err
    return ModelFolder(path, {"tokenizer": str(path)}, None, cleanup)


def reward_model_folders(reward_funcs: Any, owner: object) -> Any:
    """TRL's reward model given as a loaded ``PreTrainedModel`` (a sequence-classification head): each written to a
    temporary folder removed with ``owner``, with the tokenizer of the folder it was loaded from when there is one,
    and named by that folder as a reward model given by path is. Other entries are returned as they are."""
    from transformers import AutoTokenizer, PreTrainedModel

    def folder(model: PreTrainedModel) -> str:
        root = Path(tempfile.mkdtemp(prefix="grpolab-reward-model-"))
        weakref.finalize(owner, shutil.rmtree, root, True)
        path = root / (Path(str(model.name_or_path)).name or "reward_model")  # the name it is logged under
        model.save_pretrained(path)
        with contextlib.suppress(OSError, ValueError):  # none there: reward_processing_classes gives it
            AutoTokenizer.from_pretrained(model.name_or_path).save_pretrained(path)
        return str(path)

    if isinstance(reward_funcs, PreTrainedModel):
        return folder(reward_funcs)
    if isinstance(reward_funcs, list | tuple):
        return [folder(f) if isinstance(f, PreTrainedModel) else f for f in reward_funcs]
    return reward_funcs


def _check_object(model: Any) -> None:
    for cls in type(model).__mro__:
        wrapper = _WRAPPERS.get(cls.__name__)
        if wrapper:
            raise ConfigError(
                f"model is wrapped by {wrapper}: pass the model inside it (model.module / the unwrapped model); grpolab "
                "wraps the policy itself (DDP or FSDP2 under torchrun, train.parallel)"
            )
    if any(c.__name__ == "FSDPModule" for c in type(model).__mro__):
        raise ConfigError("model is sharded by FSDP2 (fully_shard): pass it unsharded; grpolab shards it with train.parallel=fsdp")
    if not hasattr(model, "save_pretrained") or not hasattr(model, "config"):
        raise ConfigError(
            f"model is a {type(model).__name__}: give a transformers causal LM (AutoModelForCausalLM.from_pretrained), "
            "a peft PeftModel, or its folder or hub id"
        )
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base, "is_quantized", False) or getattr(base, "hf_quantizer", None) is not None:
        raise ConfigError("model is quantized: grpolab trains float32 / bfloat16 / float16 weights; load it unquantized")
    quant = getattr(base.config, "quantization_config", None)
    if quant:  # written with the weights, it makes the run load them quantized, which fails in train()
        method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
        raise ConfigError(
            f"model's config carries a quantization config ({method or type(quant).__name__}), with which the run "
            "would load it quantized, and grpolab trains float32 / bfloat16 / float16 weights: load it unquantized "
            "(or, if its weights are plain, delete model.config.quantization_config)"
        )
    if any(p.device.type == "meta" for p in base.parameters()):
        raise ConfigError("model has weights on the meta device (not loaded): load its weights first")
    if not callable(getattr(base, "get_output_embeddings", None)) or base.get_output_embeddings() is None:
        raise ConfigError(f"model is a {type(base).__name__}, which has no LM head: give a causal LM (AutoModelForCausalLM)")


def _lora_of(model: Any) -> dict[str, Any]:
    configs = model.peft_config
    if len(configs) != 1:
        raise ConfigError(f"model is a PeftModel with {len(configs)} adapters ({', '.join(configs)}): grpolab trains one")
    (pc,) = configs.values()
    kind = str(getattr(pc.peft_type, "value", pc.peft_type))
    if kind != "LORA":
        raise ConfigError(f"model is a PeftModel with a {kind} adapter: grpolab trains LoRA adapters")
    if pc.modules_to_save:
        raise ConfigError(
            f"model's LoRA adapter also trains whole modules ({sorted(pc.modules_to_save)}, modules_to_save): grpolab "
            "trains the adapter's LoRA weights only"
        )
    return {"enabled": True, "r": pc.r, "alpha": pc.lora_alpha, "dropout": pc.lora_dropout, **lora_targets(pc)}


def _tokenizer_source(tokenizer: Any, base: Any) -> str | None:
    """A folder or hub id to read the tokenizer from, or None when the object is written beside the model."""
    if tokenizer is not None:
        if isinstance(tokenizer, str | Path):
            return str(tokenizer)
        if not hasattr(tokenizer, "save_pretrained"):
            raise ConfigError(f"processing_class is a {type(tokenizer).__name__}: give a tokenizer, its folder or hub id")
        return None
    source = getattr(base, "name_or_path", "") or getattr(base.config, "_name_or_path", "")
    if not source:
        raise ConfigError(
            "model was built in code (it has no name_or_path to read its tokenizer from): give processing_class, "
            "its tokenizer"
        )
    return str(source)


def _write(model, base, path: Path, peft: bool, tokenizer, token_source: str | None) -> Path:
    target = path / "base" if peft else path
    if peft:  # the base weights without the adapter's layers, then the adapter beside it
        state = {k.replace(".base_layer.", "."): v for k, v in base.state_dict().items() if ".lora_" not in k}
        base.save_pretrained(target, state_dict=state, safe_serialization=True)
        model.save_pretrained(path / "adapter", safe_serialization=True)
        adapter_config = path / "adapter" / "adapter_config.json"
        written = json.loads(adapter_config.read_text())
        written["base_model_name_or_path"] = str(target)
        adapter_config.write_text(json.dumps(written, indent=2))
    else:
        model.save_pretrained(target, safe_serialization=True)
    if token_source is None:
        tokenizer.save_pretrained(target)
    return path / "adapter" if peft else path


# ----------------------------------------------------------------------------- after training


@dataclass(frozen=True)
class TrainerState:
    """TRL's ``trainer.state``, as far as grpolab has it."""

    global_step: int
    """The last step trained (a grpolab step: one generation batch)."""
    log_history: list[dict[str, Any]]
    """One dict per step, the run's metrics.jsonl rows (each with its "step"), read when asked; after
    ``train()`` then the end-of-training row (``train_summary``)."""


def train_summary(rows: list[dict[str, Any]], first_step: int, last_step: int, runtime_s: float, completions_per_step: int) -> dict[str, Any]:
    """The row transformers' Trainer logs when ``train()`` ends, for the steps ``first_step``..``last_step`` it ran.

    ``train_loss`` is the mean of those steps' ``loss`` (0.0 when none ran, as transformers); a sample is a
    completion, as in TRL's batches. transformers' ``total_flos`` is left out: grpolab does not count FLOPs.
    """
    losses = [r["loss"] for r in rows if first_step <= r.get("step", 0) <= last_step and "loss" in r]
    steps = max(last_step - first_step + 1, 0)
    runtime = max(runtime_s, 1e-9)
    return {
        "train_runtime": runtime_s,
        "train_samples_per_second": steps * completions_per_step / runtime,
        "train_steps_per_second": steps / runtime,
        "train_loss": sum(losses) / len(losses) if losses else 0.0,
        "step": last_step,
    }


_TRAINER_LOGGED = ("step", "loss", "grad_norm", "learning_rate")  # transformers' Trainer logs these, not TRL's metrics


def unlogged_by_trl(rows: list[dict[str, Any]], last_step: int, logging_steps: int, updates_per_step: int) -> dict[str, Any]:
    """The metrics TRL's final row carries: the mean of each metric over the steps after its last ``logging_steps``
    row (TRL averages what it gathered since then into the next log call, the end-of-training one included).

    TRL counts optimizer steps, ``updates_per_step`` of them per grpolab step (algo.num_minibatches x algo.mu); a
    step whose last update comes after the last multiple of ``logging_steps`` was not logged by TRL yet."""
    logged_to = (last_step * updates_per_step // logging_steps) * logging_steps
    since = [r for r in rows if logged_to < r.get("step", 0) * updates_per_step and r.get("step", 0) <= last_step]
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for r in since for k in r):
        values = [r[key] for r in since if isinstance(r.get(key), int | float) and not isinstance(r.get(key), bool)]
        if key not in _TRAINER_LOGGED and values:
            out[key] = sum(values) / len(values)
    return out


def save_model(run_dir: Path, out: Path, base_name: str | None) -> Path:
    """The latest checkpoint of ``run_dir`` as a ``from_pretrained`` folder (or a PEFT adapter) at ``out``."""
    root = checkpoint_root(Path(run_dir)).resolve()
    target = Path(out).expanduser().resolve()
    if target == root or root in target.parents:  # keep_last would prune it, log.overwrite delete it
        raise GrpolabError(
            f"save_model: {out} is inside the run's checkpoints folder {root}, which the next training of this run "
            "prunes (log.keep_last) or deletes (log.overwrite); save the model outside it, e.g. the default (the run "
            "folder's model)"
        )
    checkpoint, damaged = latest_intact(run_dir)
    if checkpoint is None:
        extra = f" ({len(damaged)} damaged)" if damaged else ""
        raise GrpolabError(f"save_model: {run_dir} holds no checkpoint{extra}: train() first")
    if (checkpoint / "dcp").is_dir():
        return export(checkpoint, out)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GrpolabError(f"save_model: {out} exists and is not an empty folder; give a new one (nothing is overwritten)")
    out.mkdir(parents=True, exist_ok=True)
    extras = {p.stem for p in checkpoint.glob("*.safetensors") if not p.stem.startswith(("model", "adapter_model"))}
    for item in sorted(checkpoint.iterdir()):
        if item.is_file() and not item.name.startswith(_NOT_MODEL) and item.stem not in extras:
            shutil.copy2(item, out / item.name)
    adapter_config = out / "adapter_config.json"
    if adapter_config.is_file():  # a PeftModel's adapter names the base it was given, not the temporary copy
        written = json.loads(adapter_config.read_text())
        if base_name is not None or str(written.get("base_model_name_or_path", "")).startswith(tempfile.gettempdir()):
            written["base_model_name_or_path"] = base_name
            adapter_config.write_text(json.dumps(written, indent=2))
    return out
