"""open-r1's GRPO recipes (huggingface/open-r1: recipes/**/grpo/config_*.yaml, run by src/open_r1/grpo.py) of
every era, for ``convert_trl``:

* its script fields: every field open-r1's ScriptArguments, GRPOScriptArguments and GRPOConfig additions have
  had (src/open_r1/configs.py; grpo.py before 972e47e), and the two keys its early recipes carried that no
  class read (``dataset_configs``, ``num_processes``): mapped, listed as not applicable, or refused;
* its reward names (reward_funcs_registry / get_reward_funcs of every version; names were only ever added)
  as reward.functions entries (grpolab.rewards.open_r1);
* ``open_r1_recipe``: what open-r1's script and the TRL it pinned did with the fields a recipe leaves
  unset, filled in where every version agrees or the recipe's own keys date it, and said where they differ;
* ``world_size``: the recipe's own ``num_processes`` is the world size when the caller gives none.

The eras, and the commits they were read from, are in docs/trl.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from grpolab.errors import ConfigError
from grpolab.trl.kinds import Refused, TrlField, not_applicable
from grpolab.trl.legacy import short

if TYPE_CHECKING:
    from grpolab.trl.convert import TrlView


def _system_prompt(v: Any, t: TrlView) -> dict[str, Any]:
    if v is None:
        return {}
    return {"data.system_prompt": v, "data.chat_template": True}


def _prompt_column(v: Any, t: TrlView) -> dict[str, Any]:
    # open-r1 makes a user turn of the column (make_conversation), whatever its name: the chat template applies
    if v is None:
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
    "dataset_configs": not_applicable(
        "a key of open-r1's recipes before 45ccf60 that no open-r1 script read (grpo.py loaded dataset_name with "
        "dataset_config, which those recipes left unset); a dataset's config is dataset_config (data.name)"
    ),
    "dataset_test_split": not_applicable("grpolab evaluates held-out training rows (data.eval_size)"),
    "dataset_streaming": not_applicable("grpolab reads the whole dataset"),
    "gradient_checkpointing_use_reentrant": not_applicable("a speed option"),
    "ignore_bias_buffers": not_applicable("a DDP setting"),
    "dataset_mixture": TrlField("refused", "grpolab trains on one dataset: mix them into one file (data.path)"),
    "benchmarks": not_applicable("open-r1's evaluation jobs after saving; grpolab eval evaluates checkpoints"),
    "callbacks": not_applicable("open-r1's callbacks (push to a Hub revision); grpolab pushes nothing to the Hub"),
    "hub_model_revision": not_applicable(_HUB),
    "overwrite_hub_revision": not_applicable(_HUB),
    "push_to_hub_revision": not_applicable(_HUB),
    "wandb_entity": not_applicable("set WANDB_ENTITY in the environment; grpolab's wandb reads it"),
    "wandb_project": TrlField("mapped", "read with project (TRL's trackio project): log.project", lambda v, t: {}),
    "wandb_run_group": not_applicable("set WANDB_RUN_GROUP in the environment"),
    "wandb_log_unique_prompts": not_applicable("grpolab writes completions to samples.jsonl and the trackers"),
    "num_processes": TrlField(
        "mapped", "the world size (TRL's batch sizes are per process) when --num-processes is not given", lambda v, t: {}
    ),
    **{name: TrlField("mapped", _READ, lambda v, t: {}) for name in (
        "cosine_min_value_wrong", "cosine_max_value_wrong", "cosine_min_value_correct", "cosine_max_value_correct",
        "cosine_max_len", "repetition_n_grams", "repetition_max_penalty", "code_language", "code_eval_test_batch_size",
        "code_eval_scoring_mode", "parallel_code_exec_per_proc", "e2b_router_url", "morph_router_url", "code_provider",
        "ioi_provider", "max_completion_len", "soft_punish_cache", "enforce_same_language",
    )},
}
OPEN_R1_DEFAULTS: dict[str, Any] = {
    "dataset_prompt_column": None, "system_prompt": None, "chat_template": None, "dataset_configs": None,
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
}  # open-r1's src/open_r1/configs.py, every version to 1416fa0 (dataset_prompt_column None: given or not)


_OWN = "grpolab.rewards.open_r1"
OPEN_R1_REWARDS = (
    "accuracy", "format", "tag_count", "reasoning_steps", "length", "code", "binary_code", "ioi_code", "cf_code",
    "code_format", "cosine", "repetition_penalty", "soft_overlong_punishment",
)
"""Every name open-r1's registry has held (b47b1d0 to 1416fa0): none was renamed or dropped."""


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


# ----------------------------------------------------------------------------- what a recipe leaves unsaid, by era

EARLY_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The assistant "
    "first thinks about the reasoning process in the mind and then provides the user with the answer. The reasoning "
    "process and answer are enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., "
    "<think> reasoning process here </think><answer> answer here </answer>"
)
"""The system turn open-r1's grpo.py put before every prompt from 05496dc to 78c197d (2025-01-25 to 02-18)."""

_PINNED_TRL = {"beta": 0.04, "max_completion_length": 256, "max_prompt_length": 512, "bf16": False}
"""GRPOConfig defaults on which every TRL open-r1 pinned agrees (main of 2025-01 to 0.18.0), where TRL 1.16's
differ (beta 0.0 from TRL 0.19, max_completion_length 512, no prompt cut, bf16 None = on)."""

_TRL_SCRIPT = frozenset({  # trl.ScriptArguments' fields, and the trl CLI's accelerate option: not open-r1's own
    "dataset_test_split", "dataset_streaming", "gradient_checkpointing_use_reentrant", "ignore_bias_buffers",
    "num_processes",
})
_OWN_FIELDS = frozenset(OPEN_R1_FIELDS) - _TRL_SCRIPT  # TRL's own grpo script has none of these
_EARLY = "dataset_configs"  # in every open-r1 recipe before 45ccf60 (2025-03-03), in none after
_SPACED = f"{_OWN}.format_reward_spaced"


def _reward_names(given: Mapping[str, Any]) -> list[Any]:
    funcs = given.get("reward_funcs")
    return [funcs] if isinstance(funcs, str) else list(funcs) if isinstance(funcs, list | tuple) else []


def is_open_r1(given: Mapping[str, Any]) -> bool:
    """A recipe for open-r1's grpo.py: it sets a field only open-r1's script has, or names an open-r1 reward."""
    return bool(_OWN_FIELDS & set(given)) or any(isinstance(n, str) and n in OPEN_R1_REWARDS for n in _reward_names(given))


def open_r1_recipe(given: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the fields with what open-r1 did for the unset ones filled in, the report's lines). Not open-r1's: as given."""
    out = dict(given)
    if not is_open_r1(out):
        return out, []
    said = []
    pinned = {k: v for k, v in _PINNED_TRL.items() if k not in out}
    if pinned:
        out.update(pinned)
        said.append(
            f"{', '.join(f'{k}={v}' for k, v in pinned.items())}: unset in the recipe, so TRL's defaults where open-r1 "
            "ran it (every TRL it pinned, main of 2025-01 to 0.18.0, agrees; TRL 1.16's differ)"
        )
    said += _early(out) if _EARLY in out else _later(out)
    return out, said


def _early(out: dict[str, Any]) -> list[str]:
    """A recipe with dataset_configs: open-r1's before 45ccf60 (2025-03-03), run by TRL main of its day."""
    said = []
    before_78c = "system_prompt" not in out  # every recipe from 78c197d (2025-02-18) on sets one
    fills = [
        ("dataset_prompt_column", "problem", "open-r1's grpo.py read the problem column until 1802bec (2025-03-28)"),
        ("temperature", 0.9, "TRL's default before 0.18.0"),
        ("reward_funcs", ["accuracy", "format"], "open-r1's default before 566cfd1 (2025-02-24), but for 250ab46 to "
         "e4ac3ae (2025-02-07 to 02-10): [accuracy, format, reasoning_steps, cosine]"),
    ]
    if before_78c:
        fills += [
            ("system_prompt", EARLY_SYSTEM_PROMPT, "the system turn open-r1's grpo.py added before 78c197d (2025-02-18)"),
            ("loss_type", "grpo", "TRL main averaged each completion's tokens until 293b620 (2025-02-17), the "
             "micro-batch's (bnpo) after"),
        ]
    for key, value, why in fills:
        if key not in out:
            out[key] = value
            said.append(f"{key}={short(value)}: unset in a recipe dated before 45ccf60 by dataset_configs: {why}")
    if before_78c:
        names = _reward_names(out)
        if "format" in names:
            out["reward_funcs"] = [_SPACED if n == "format" else n for n in names]
            said.append(
                "reward format: read as open-r1's format of d12886d to 566cfd1 (2025-02-08 to 02-24), "
                f"{_SPACED.replace('.format', ':format')}, which takes the system prompt's <think> </think><answer> "
                "</answer> on one line; before d12886d it matched no newline at all (format_reward_inline)"
            )
        said.append(
            "per_device_train_batch_size: TRL counted it in prompts (each with num_generations completions) until "
            "#2776 (2025-02-06); it is read as completions, as open-r1's recipes from 52aa875 (2025-02-11) are "
            "written: for an older one, multiply it by num_generations"
        )
    else:
        said += _bnpo(out)
        if "format" in _reward_names(out):
            said.append(
                "reward format: open-r1's newline-strict format (566cfd1, 2025-02-24, on); a recipe of 78c197d to "
                f"566cfd1 was scored by {_SPACED.replace('.format', ':format')}"
            )
    return said


def _later(out: dict[str, Any]) -> list[str]:
    """open-r1's recipes from 45ccf60 (2025-03-03) on: TRL 69ad852, 0.16.0, then commits to 0.18.0."""
    said = _bnpo(out)
    unset = [k for k in ("temperature", "top_k") if k not in out]
    if unset:
        said.append(
            f"{' / '.join(unset)} unset: sampled as TRL 0.18.0 does (open-r1 from b806e10, 2025-05-28), temperature 1.0 "
            "without top-k; before, TRL sampled at temperature 0.9, and 0.16 / 0.17 (from 8000dd2, 2025-03-24) with "
            "top_k 50: set them for a recipe of then"
        )
    return said


def _bnpo(out: dict[str, Any]) -> list[str]:
    """TRL from 293b620 (2025-02-17) to 0.18.0 averaged the loss over each micro-batch's tokens (loss_type bnpo)."""
    if "loss_type" in out:
        return []
    out["loss_type"] = "bnpo"
    return ["loss_type=bnpo: unset; TRL's loss from 293b620 (2025-02-17) to 0.18.0 (each micro-batch of "
            "per_device_train_batch_size completions divided by its own tokens)"]


def world_size(caller: int | None, given: Mapping[str, Any]) -> tuple[int, str | None]:
    """TRL's batch sizes are per process: the caller's count (--num-processes), else the recipe's own
    ``num_processes``, else 1; the line says which, when the recipe names one. The trl CLI launches that many
    processes; open-r1's early recipes wrote the count their launch command passed (its GPUs less vLLM's),
    which TrlParser itself ignored."""
    recipe = given.get("num_processes")
    if recipe is None:
        return (1 if caller is None else caller), None
    if isinstance(recipe, bool) or not isinstance(recipe, int) or not 1 <= recipe <= 2**16:
        raise ConfigError(f"num_processes={short(recipe)}: the recipe's process count must be a whole number from 1 to 2^16")
    if caller is None:
        return recipe, f"num_processes={recipe}: the recipe's own process count is the world size (--num-processes N for another)"
    if caller != recipe:
        return caller, f"num_processes={recipe}: the recipe's process count, not used: --num-processes {caller} is"
    return caller, None
