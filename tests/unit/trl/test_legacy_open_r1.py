"""open-r1's GRPO recipes (tests/data/open_r1, every one under its recipes/) through grpolab convert-trl,
each then accepted by grpolab config with a local tiny model and dataset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from grpolab.cli import main
from grpolab.errors import ConfigError
from grpolab.trl.convert import convert_trl

pytest.importorskip("trl", reason="convert-trl reads TRL's GRPOConfig fields: pip install 'grpolab[trl]'")
RECIPES = sorted((Path(__file__).parents[2] / "data" / "open_r1").glob("*.yaml"))


def _processes(path: Path) -> int:
    """open-r1 trains on 1 process where the geometry allows, else on 7 GPUs (the 8th serves vLLM)."""
    try:
        convert_trl(path, dataset_rows=100)
        return 1
    except ConfigError as err:
        assert "it fits 7," in str(err), err  # the refusal names the process counts that fit
        return 7


def test_every_recipe_is_collected():
    assert len(RECIPES) == 5


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_an_open_r1_recipe_converts_to_a_config_grpolab_accepts(recipe, tiny_model_dir, tmp_path, capsys):
    source = yaml.safe_load(recipe.read_text())
    conversion = convert_trl(recipe, num_processes=_processes(recipe), dataset_rows=100)
    keys = conversion.keys
    legacy = " ".join(conversion.legacy)
    assert "torch_dtype='bfloat16': read as dtype" in legacy and "warmup_ratio" in legacy and "max_prompt_length" in legacy
    assert keys["model.dtype"] == "bfloat16" and keys["data.max_prompt_length"] == source["max_prompt_length"]
    assert keys["data.system_prompt"] == source["system_prompt"] and keys.get("data.prompt_field", "prompt") == source["dataset_prompt_column"]
    assert keys["data.path"] == source["dataset_name"] and keys["optim.lr"] == source["learning_rate"]
    assert keys["algo.beta"] == source.get("beta", 0.04)  # open-r1 ran TRL <= 0.18.0, whose beta was 0.04
    assert keys["data.chat_template"] is True  # open-r1 makes a user turn of the prompt column, "prompt" too
    names = [spec["name"] for spec in keys["reward.functions"]]
    assert len(names) == len(source["reward_funcs"])
    assert [spec["weight"] for spec in keys["reward.functions"]] == source["reward_weights"]
    ignored = " ".join(conversion.ignored)
    assert "overwrite_output_dir=True: a legacy name, not applicable" in ignored and "push_to_hub=True" in ignored
    # the run length is known (100 rows or max_steps), so warm-up and fractional save_steps are steps now
    assert isinstance(keys["train.num_steps"], int) and isinstance(keys["optim.warmup_steps"], int)
    if source.get("lr_scheduler_kwargs"):
        assert keys["optim.min_lr_ratio"] == source["lr_scheduler_kwargs"]["min_lr_rate"]

    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"problem": "1+1", "prompt": "1+1", "problem_statement": "x", "solution": "2"}) + "\n")
    nested = conversion.config_dict()
    nested["model"]["name_or_path"] = tiny_model_dir
    nested["data"].update(source="jsonl", path=str(data), name=None)
    path = tmp_path / "grpolab.yaml"
    path.write_text(yaml.safe_dump(nested))
    assert main(["config", "--config", str(path)]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["data"]["system_prompt"] == source["system_prompt"]


def test_open_r1_reward_names_map_to_functions_of_the_same_definition():
    conversion = convert_trl({"reward_funcs": ["accuracy", "format", "tag_count", "soft_overlong_punishment"],
                              "max_completion_len": 100, "soft_punish_cache": 20, "use_cpu": True, "bf16": False})
    specs = conversion.keys["reward.functions"]
    assert [s["name"] for s in specs] == [
        "grpolab.rewards.open_r1:accuracy_reward", "grpolab.rewards.open_r1:format_reward",
        "grpolab.rewards.open_r1:tag_count_reward", "soft_overlong",
    ]
    assert specs[3]["kwargs"] == {"max_length": 100, "cache_length": 20}


def test_strict_geometry_names_the_process_counts_that_fit():
    with pytest.raises(ConfigError, match=r"with 1 process: generation_batch_size 64 .* num_generations 14; it fits 7, 14"):
        convert_trl({"per_device_train_batch_size": 16, "gradient_accumulation_steps": 4, "num_generations": 14,
                     "use_cpu": True, "bf16": False})
