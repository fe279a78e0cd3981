"""What recipes in the wild hold beside TRL 1.16's GRPOConfig, for ``convert_trl``:

* legacy names: fields TRL or transformers renamed or dropped (``torch_dtype``, ``warmup_ratio``,
  ``max_prompt_length``, ``overwrite_output_dir``, ...), read under their current name or listed as not
  applicable, and said so in the report;
* open-r1's script fields (huggingface/open-r1, src/open_r1/configs.py: its ScriptArguments,
  GRPOScriptArguments and GRPOConfig additions), and its reward names (src/open_r1/rewards.py,
  ``get_reward_funcs``) mapped to the functions in grpolab.rewards.open_r1.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from grpolab.errors import ConfigError
from grpolab.trl.kinds import Refused, TrlField, not_applicable

if TYPE_CHECKING:
    from grpolab.trl.convert import TrlView

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


# ----------------------------------------------------------------------------- open-r1's script fields


def _data_key(key: str, skip: Any = None):
    return lambda v, t: {} if v == skip else {key: v}


def _system_prompt(v: Any, t: TrlView) -> dict[str, Any]:
    if v is None:
        return {}
    return {"data.system_prompt": v, "data.chat_template": True}


def _prompt_column(v: Any, t: TrlView) -> dict[str, Any]:
    # open-r1 always makes a conversation of the column (make_conversation): the chat template applies
    if v == "prompt":  # the default: TRL's own script's prompt column as it is
        return {}
    return {"data.prompt_field": v, "data.chat_template": True}


def _chat_template(v: Any, t: TrlView) -> dict[str, Any]:
    if v:
        t.todo(
            "chat_template: grpolab renders prompts with the tokenizer's own template; write the recipe's "
            "chat_template into model.tokenizer's tokenizer_config.json (chat_template) and point model.tokenizer there"
        )
    return {}


_HUB = "the Hugging Face Hub: grpolab writes local folders"
_READ = "read with reward_funcs (open-r1's reward settings)"

OPEN_R1_FIELDS: dict[str, TrlField] = {
    "dataset_prompt_column": TrlField("mapped", "data.prompt_field (data.chat_template, as open-r1's chat prompts)", _prompt_column),
    "system_prompt": TrlField("mapped", "data.system_prompt (with data.chat_template)", _system_prompt),
    "chat_template": TrlField("mapped", "a to-fill item: the template goes in the tokenizer's files", _chat_template),
    "dataset_configs": TrlField("mapped", "data.name", _data_key("data.name")),
    "dataset_test_split": not_applicable("grpolab evaluates held-out training rows (data.eval_size)"),
    "dataset_streaming": not_applicable("grpolab reads the whole dataset"),
    "gradient_checkpointing_use_reentrant": not_applicable("a speed option"),
    "ignore_bias_buffers": not_applicable("a DDP setting"),
    "dataset_mixture": TrlField("refused", "grpolab trains on one dataset: mix them into one file (data.path)"),
    "benchmarks": not_applicable("open-r1's evaluation jobs after saving; grpolab eval evaluates checkpoints"),
    "callbacks": not_applicable("open-r1's callbacks (push to a Hub revision); grpolab has no callbacks"),
    "hub_model_revision": not_applicable(_HUB),
    "overwrite_hub_revision": not_applicable(_HUB),
    "push_to_hub_revision": not_applicable(_HUB),
    "wandb_entity": not_applicable("set WANDB_ENTITY in the environment; grpolab's wandb reads it"),
    "wandb_project": TrlField("mapped", "log.project", _data_key("log.project")),
    "wandb_run_group": not_applicable("set WANDB_RUN_GROUP in the environment"),
    "wandb_log_unique_prompts": not_applicable("grpolab writes completions to samples.jsonl and the trackers"),
    "num_processes": not_applicable("accelerate's process count: pass grpolab convert-trl --num-processes N"),
    **{name: TrlField("mapped", _READ, lambda v, t: {}) for name in (
        "cosine_min_value_wrong", "cosine_max_value_wrong", "cosine_min_value_correct", "cosine_max_value_correct",
        "cosine_max_len", "repetition_n_grams", "repetition_max_penalty", "code_language", "code_eval_test_batch_size",
        "code_eval_scoring_mode", "parallel_code_exec_per_proc", "e2b_router_url", "morph_router_url", "code_provider",
        "ioi_provider", "max_completion_len", "soft_punish_cache", "enforce_same_language",
    )},
}
OPEN_R1_DEFAULTS: dict[str, Any] = {
    "dataset_prompt_column": "prompt", "system_prompt": None, "chat_template": None, "dataset_configs": None,
    "dataset_test_split": "test", "dataset_streaming": False, "gradient_checkpointing_use_reentrant": False,
    "ignore_bias_buffers": False, "dataset_mixture": None, "benchmarks": [], "callbacks": [],
    "hub_model_revision": "main", "overwrite_hub_revision": False, "push_to_hub_revision": False,
    "wandb_entity": None, "wandb_project": None, "wandb_run_group": None, "wandb_log_unique_prompts": True,
    "num_processes": None, "cosine_min_value_wrong": 0.0, "cosine_max_value_wrong": -0.5,
    "cosine_min_value_correct": 0.5, "cosine_max_value_correct": 1.0, "cosine_max_len": 1000,
    "repetition_n_grams": 3, "repetition_max_penalty": -1.0, "code_language": "python",
    "code_eval_test_batch_size": 1, "code_eval_scoring_mode": "weighted_sum", "parallel_code_exec_per_proc": 2,
    "e2b_router_url": None, "morph_router_url": None, "code_provider": "e2b", "ioi_provider": "piston",
    "max_completion_len": 16384, "soft_punish_cache": 4096, "enforce_same_language": False,
}  # open-r1 commit 1416fa0, src/open_r1/configs.py


_OWN = "grpolab.rewards.open_r1"


def open_r1_reward(name: str, t: TrlView) -> dict[str, Any] | None:
    """open-r1's reward ``name`` as a reward.functions entry; None when it is not one of open-r1's names."""
    code_kwargs = {"num_parallel": t["parallel_code_exec_per_proc"], "provider_type": t["code_provider"],
                   "enforce_same_language": t["enforce_same_language"]}
    table: dict[str, dict[str, Any]] = {
        "accuracy": {"name": f"{_OWN}:accuracy_reward"},
        "format": {"name": f"{_OWN}:format_reward"},
        "tag_count": {"name": f"{_OWN}:tag_count_reward"},
        "reasoning_steps": {"name": f"{_OWN}:reasoning_steps_reward"},
        "length": {"name": "open_r1.rewards:len_reward"},
        "code": {"name": "open_r1.rewards:code_reward", "kwargs": code_kwargs},
        "binary_code": {"name": "open_r1.rewards:binary_code_reward", "kwargs": code_kwargs},
        "ioi_code": {"name": "open_r1.rewards:ioi_code_reward", "kwargs": {
            "test_batch_size": t["code_eval_test_batch_size"], "provider_type": t["ioi_provider"]}},
        "cf_code": {"name": "open_r1.rewards:cf_code_reward", "kwargs": {
            "test_batch_size": t["code_eval_test_batch_size"], "scoring_mode": t["code_eval_scoring_mode"]}},
        "code_format": {"name": f"{_OWN}:code_format_reward", "kwargs": {"language": t["code_language"]}},
        "cosine": {"name": f"{_OWN}:cosine_reward", "kwargs": {"cosine": {
            "min_value_wrong": t["cosine_min_value_wrong"], "max_value_wrong": t["cosine_max_value_wrong"],
            "min_value_correct": t["cosine_min_value_correct"], "max_value_correct": t["cosine_max_value_correct"],
            "max_len": t["cosine_max_len"]}}},
        "repetition_penalty": {"name": f"{_OWN}:repetition_penalty_reward", "kwargs": {
            "ngram_size": t["repetition_n_grams"], "max_penalty": t["repetition_max_penalty"]}},
    }
    if name == "soft_overlong_punishment":  # the same DAPO ramp as grpolab's soft_overlong
        if not 0 < t["soft_punish_cache"] <= t["max_completion_len"]:
            raise Refused("soft_overlong_punishment needs 0 < soft_punish_cache <= max_completion_len")
        return {"name": "soft_overlong", "kwargs": {
            "max_length": t["max_completion_len"], "cache_length": t["soft_punish_cache"]}}
    spec = table.get(name)
    if spec is None:
        return None
    if spec["name"].startswith("open_r1."):
        t.note(f"reward {name}: runs open-r1's own {spec['name']} (pip install open-r1, and its sandbox as open-r1 documents)")
    return {**spec, "kind": "trl"}
