"""Legacy names, for ``convert_trl``: fields TRL or transformers renamed or dropped (``torch_dtype``,
``warmup_ratio``, ``max_prompt_length``, ``overwrite_output_dir``, ...), read under their current name or listed
as not applicable, and said so in the report; and the bounded reprs and size checks every message uses.
open-r1's recipes of every era are grpolab.trl.open_r1's.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from typing import Any

from grpolab.errors import ConfigError

RENAMED: dict[str, tuple[str, str]] = {
    "torch_dtype": ("dtype", "transformers 5 renamed torch_dtype to dtype"),
    "evaluation_strategy": ("eval_strategy", "transformers renamed it eval_strategy"),
    "no_cuda": ("use_cpu", "transformers renamed it use_cpu"),
    "per_gpu_train_batch_size": ("per_device_train_batch_size", "transformers renamed it"),
    "per_gpu_eval_batch_size": ("per_device_eval_batch_size", "transformers renamed it"),
    "warmup_ratio": ("warmup_steps", "transformers 5 reads a warmup_steps below 1 as the ratio"),
    "push_to_hub_model_id": ("hub_model_id", "transformers renamed it"),
    "push_to_hub_token": ("hub_token", "transformers renamed it"),
    "vllm_guided_decoding_regex": ("vllm_structured_outputs_regex", "TRL renamed it"),
    "use_liger_loss": ("use_liger_kernel", "TRL renamed it"),
}
"""A removed name -> (the current GRPOConfig field that reads it, why)."""

_GONE = "dropped by transformers; it does not change what is trained"
LEGACY_NOT_APPLICABLE: dict[str, str] = {
    "overwrite_output_dir": "transformers' example scripts used it to skip resuming (the Trainer never deleted "
    "anything for it); grpolab starts a new run unless --resume, and never deletes a run unless log.overwrite",
    "logging_dir": "grpolab writes the TensorBoard logs in the run folder",
    "save_safetensors": "grpolab always saves safetensors",
    "vllm_device": "TRL's old vLLM placement; grpolab places its engine itself",
    "vllm_dtype": "TRL's old vLLM setting; the engine takes the model's dtype",
    "vllm_enable_prefix_caching": "a speed option of TRL's old vLLM setup",
    **{name: _GONE for name in (
        "use_mps_device", "fp16_backend", "half_precision_backend", "push_to_hub_organization",
        "include_tokens_per_second", "include_inputs_for_metrics", "tpu_num_cores", "tpu_metrics_debug",
        "jit_mode_eval", "use_ipex", "fp16_opt_level", "torchdynamo", "ray_scope", "mp_parameters", "split_batches",
        "dispatch_batches", "use_legacy_prediction_loop", "past_index", "fsdp_min_num_params",
        "fsdp_transformer_layer_cls_to_wrap", "xpu_backend",
    )},
}


def legacy_names(given: Mapping[str, Any], current: Mapping[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """(the fields under their current names, the report's 'legacy' lines, its not-applicable lines)."""
    out = dict(given)
    said, ignored = [], []
    for old, (new, why) in RENAMED.items():
        if old not in out:
            continue
        value = out.pop(old)
        if new in given and given[new] != current.get(new):
            said.append(f"{old}={short(value)}: not read, {new}={short(given[new])} is given too ({why})")
            continue
        if value is None:
            continue
        out[new] = value
        said.append(f"{old}={short(value)}: read as {new} ({why})")
    if "max_prompt_length" in out:  # TRL < 1.0 cut longer prompts from the left
        value = out.pop("max_prompt_length")
        if value is not None:
            out["data.max_prompt_length"] = value
            said.append(
                f"max_prompt_length={short(value)}: read as data.max_prompt_length (TRL dropped it); TRL cut longer "
                "prompts from the left, grpolab stops with an error naming the row"
            )
    for name, why in LEGACY_NOT_APPLICABLE.items():
        if name in out:
            ignored.append(f"{name}={short(out.pop(name))}: a legacy name, not applicable: {why}")
    return out, said, ignored


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother = 3, 6, 6, 80, 80
_SHORT.maxlong = 24


def short(value: Any) -> str:
    """A bounded repr for messages (a YAML alias bomb would otherwise be printed in full)."""
    return _SHORT.repr(value)


def check_size(name: str, value: Any, limit: int = 10_000) -> None:
    """Refuse a value with more than ``limit`` nested items before anything walks it (YAML aliases let a
    few lines stand for billions of items)."""
    stack, seen = [value], 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > limit:
            raise ConfigError(
                f"TRL field {name}: its value holds more than {limit} nested items (YAML aliases repeating "
                "themselves?); no TRL field takes that much: write it out"
            )
        if isinstance(node, Mapping):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list | tuple | set):
            stack.extend(node)
