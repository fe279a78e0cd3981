"""The fields of the ``trl grpo`` script beside GRPOConfig, for ``convert_trl``: trl.ModelConfig (model, dtype,
LoRA, quantization), trl.ScriptArguments (dataset), GRPOScriptArguments (reward_funcs), the trl CLI's
``datasets`` / ``accelerate_config``, and open-r1's script fields (grpolab.trl.open_r1), which a recipe
for open-r1's ``grpo.py`` holds."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpolab.trl.kinds import Refused, TrlField, named, not_applicable, refused, worded
from grpolab.trl.legacy import short
from grpolab.trl.open_r1 import OPEN_R1_DEFAULTS, OPEN_R1_FIELDS, open_r1_reward

if TYPE_CHECKING:
    from grpolab.trl.convert import TrlView



def _model_dtype(v: Any, t: TrlView) -> dict[str, Any]:
    if v in (None, "float32", "bfloat16", "float16"):
        return {"model.dtype": v or "float32"}
    raise Refused(f"dtype={v}: grpolab's model.dtype is float32, bfloat16 or float16 (no 'auto')")


def _dataset(v: Any, t: TrlView) -> dict[str, Any]:
    if not v:
        return {}
    local = Path(str(v))
    return {"data.source": "jsonl" if local.suffix == ".jsonl" else "hf", "data.path": str(v)}


_TRL_REWARDS = ("accuracy_reward", "reasoning_accuracy_reward", "think_format_reward", "get_soft_overlong_punishment")


def _reward_funcs(v: Any, t: TrlView) -> dict[str, Any]:
    """TRL's named rewards run unchanged (grpolab calls TRL-style functions as TRL does); a dotted path
    ``pkg.mod.fn`` becomes ``pkg.mod:fn``."""
    names = [v] if isinstance(v, str) else list(v or [])
    specs = []
    for name in names:
        if name == "get_soft_overlong_punishment":
            raise Refused("get_soft_overlong_punishment is a factory: use grpolab's soft_overlong reward")
        own = open_r1_reward(name, t) if isinstance(name, str) and name not in _TRL_REWARDS else None
        if own is not None:
            specs.append(own)
            continue
        target = f"trl.rewards:{name}" if name in _TRL_REWARDS else ":".join(str(name).rsplit(".", 1))
        if ":" not in target:
            raise Refused(
                f"reward_funcs entry {short(name)} is neither a TRL reward, one of open-r1's names, nor a dotted "
                "path pkg.module.fn"
            )
        specs.append({"name": target, "kind": "trl"})
    if t["reward_model_name_or_path"]:
        specs.append({"name": "reward_model", "kwargs": {"path": t["reward_model_name_or_path"]}})
    t.rewards = specs
    return {"reward.functions": specs} if specs else {}


def _lora(v: Any, t: TrlView) -> dict[str, Any]:
    if not v:
        return {}
    out = {"model.lora.enabled": True, "model.lora.r": t["lora_r"], "model.lora.alpha": t["lora_alpha"]}
    out["model.lora.dropout"] = t["lora_dropout"]
    if t["lora_target_modules"]:
        out["model.lora.target_modules"] = t["lora_target_modules"]
    if t["lora_target_parameters"]:  # peft's ParamWrapper: a Mixture-of-Experts' stacked expert weights
        out["model.lora.target_parameters"] = list(t["lora_target_parameters"])
        if not t["lora_target_modules"]:  # peft then adapts the parameters alone
            out["model.lora.target_modules"] = []
    return out


def _script_key(key: str, skip: Any = None):
    return lambda v, t: {} if v == skip else {key: v}


_PLAIN_LORA = "grpolab trains plain LoRA adapters on lora_target_modules (model.lora)"
_MODEL_CONFIG_REST: dict[str, TrlField] = {
    "lora_modules_to_save": refused(f"{_PLAIN_LORA}: no module is trained in full beside them"),
    "lora_task_type": refused(f"{_PLAIN_LORA} of a causal LM (CAUSAL_LM)"),
    "use_rslora": refused(f"{_PLAIN_LORA}, scaled by alpha / r (rsLoRA scales by alpha / sqrt(r))"),
    "use_dora": refused(f"{_PLAIN_LORA} (no DoRA)"),
    "load_in_8bit": refused("grpolab loads unquantized weights (model.dtype); it has no bitsandbytes loading"),
    "load_in_4bit": refused("grpolab loads unquantized weights (model.dtype); it has no bitsandbytes loading"),
    "bnb_4bit_quant_type": not_applicable("read only with load_in_4bit"),
    "use_bnb_nested_quant": not_applicable("read only with load_in_4bit"),
    "bnb_4bit_quant_storage": not_applicable("read only with load_in_4bit"),
}
"""trl.ModelConfig's other fields (TRL 0.14 to 1.16): adapters and quantization grpolab does not have."""

SCRIPT_FIELDS: dict[str, TrlField] = worded({
    "model_name_or_path": named(_script_key("model.name_or_path")),
    "model_revision": TrlField("mapped", "model.revision", _script_key("model.revision", "main")),
    "dtype": TrlField("mapped", "model.dtype", _model_dtype),
    "attn_implementation": TrlField("mapped", "model.attn_implementation", _script_key("model.attn_implementation")),
    "use_peft": TrlField("mapped", "model.lora.*", _lora),
    "lora_r": TrlField("mapped", "read with use_peft", lambda v, t: {}),
    "lora_alpha": TrlField("mapped", "read with use_peft", lambda v, t: {}),
    "lora_dropout": TrlField("mapped", "read with use_peft", lambda v, t: {}),
    "lora_target_modules": TrlField("mapped", "read with use_peft", lambda v, t: {}),
    "lora_target_parameters": TrlField("mapped", "read with use_peft (model.lora.target_parameters)", lambda v, t: {}),
    **_MODEL_CONFIG_REST,
    "dataset_name": named(_dataset),
    "dataset_config": TrlField("mapped", "data.name", _script_key("data.name")),
    "dataset_train_split": TrlField("mapped", "data.split", _script_key("data.split", "train")),
    "reward_funcs": named(_reward_funcs),
    "reward_model_name_or_path": TrlField("mapped", "read with reward_funcs", lambda v, t: {}),
    "datasets": TrlField("refused", "trl grpo's dataset mixture (DatasetMixtureConfig): grpolab trains on one "
                         "dataset: mix them into one file (data.path), or give one as dataset_name"),
    "accelerate_config": TrlField("not_applicable", "the trl CLI's accelerate launch profile (DeepSpeed, FSDP, "
                                  "multi-GPU): grpolab picks DDP or FSDP2 with train.parallel; pass --num-processes N"),
    **OPEN_R1_FIELDS,
})
SCRIPT_DEFAULTS: dict[str, Any] = {
    "model_name_or_path": None, "model_revision": "main", "dtype": None, "attn_implementation": None,
    "use_peft": False, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "lora_target_modules": None,
    "lora_target_parameters": None, "lora_modules_to_save": None, "lora_task_type": "CAUSAL_LM", "use_rslora": False,
    "use_dora": False, "load_in_8bit": False, "load_in_4bit": False, "bnb_4bit_quant_type": "nf4",
    "use_bnb_nested_quant": False, "bnb_4bit_quant_storage": None,
    "dataset_name": None, "dataset_config": None, "dataset_train_split": "train", "reward_funcs": None,
    "reward_model_name_or_path": None, "datasets": [], "accelerate_config": None, **OPEN_R1_DEFAULTS,
}  # trl.ModelConfig, trl.ScriptArguments, GRPOScriptArguments and DatasetMixtureConfig of TRL 1.16, the trl CLI, open-r1
