"""The TRL docs' GRPOConfig examples (tests/data/trl_docs, every GRPOConfig(...) and trl grpo config the docs
show) through grpolab convert-trl: each converts to a config that grpolab config accepts with a local tiny
model and dataset, or is refused, by name and with the reason, because it changes the training in a way
grpolab cannot reproduce."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from grpolab.cli import main
from grpolab.errors import ConfigError
from grpolab.trl.convert import convert_trl

pytest.importorskip("trl", reason="convert-trl reads TRL's GRPOConfig fields: pip install 'grpolab[trl]'")
EXAMPLES = sorted((Path(__file__).parents[2] / "data" / "trl_docs").glob("*.yaml"))
_CANNOT = "convert-trl: grpolab cannot reproduce "
_STEP_SPANS = "an optimizer step would span two generation batches, which grpolab's steps never do"

# Each refused example, with the message that names the field and why. Every one is a field that changes
# the training and that grpolab has no counterpart for; the reason is in the comment.
REFUSED = {
    # multi-turn tool calling generates different completions; grpolab samples one turn
    "harbor__quick_start": _CANNOT + "max_tool_calling_iterations=25: grpolab has no tool-calling loop",
    "openreward__quick_start": _CANNOT + "max_tool_calling_iterations=20: grpolab has no tool-calling loop",
    # MIS with a lower bound: grpolab's rollout correction bounds the weight from above only
    "paper_index__mis": _CANNOT + "vllm_importance_sampling_correction=True: grpolab's rollout correction bounds the weight from above only",
    # steps_per_generation 16 < gradient_accumulation_steps 128: one optimizer step over 8 generation batches
    "paper_index__deepseekmath": _STEP_SPANS,
    # steps_per_generation 8 < gradient_accumulation_steps 32, likewise
    "paper_index__lite_ppo": _STEP_SPANS,
    # on TRL's 1 GPU, 2 optimizer steps each take half of the one group of 8 (16) completions; grpolab's
    # minibatches hold whole groups, so a group's completions are never split over optimizer steps
    "lora_without_regret__grpo": "split a group of num_generations=8 completions over optimizer steps; grpolab's minibatches hold whole groups",
    "lora_without_regret__grpo_cli": "split a group of num_generations=16 completions over optimizer steps; grpolab's minibatches hold whole groups",
    # trl grpo's dataset mixture: two datasets interleaved; grpolab trains on one
    "clis__grpo_datasets": _CANNOT + "datasets=[{'path': 'HuggingFaceH4/Polaris-Dataset-53K'}, {'path': 'trl-lib/DeepMath-103K'}]: trl grpo's dataset mixture",
}


def _processes(path: Path) -> int:
    """The docs' multi-GPU examples (the 70B SLURM run, DeepSeek-R1, ...) are no multiple of num_generations on
    one process, as TRL itself refuses: convert them on the fewest processes the refusal names."""
    try:
        convert_trl(path, dataset_rows=100)
        return 1
    except ConfigError as err:
        fits = re.search(r"is not a multiple of num_generations \d+; it fits (\d+)", str(err))
        if not fits:
            return 1
        return int(fits.group(1))


def test_every_example_is_collected():
    assert len(EXAMPLES) == 47
    assert set(REFUSED) <= {p.stem for p in EXAMPLES}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_a_trl_docs_example_converts_to_a_config_grpolab_accepts(example, tiny_model_dir, tmp_path, capsys):
    source = yaml.safe_load(example.read_text())
    if example.stem in REFUSED:
        with pytest.raises(ConfigError) as err:
            convert_trl(example, num_processes=_processes(example), dataset_rows=100)
        assert REFUSED[example.stem] in str(err.value)
        return
    conversion = convert_trl(example, num_processes=_processes(example), dataset_rows=100)
    keys = conversion.keys
    if "learning_rate" in source:
        assert keys["optim.lr"] == source["learning_rate"]
    if "num_generations" in source:
        assert keys["rollout.num_generations"] == source["num_generations"]
    if "max_completion_length" in source:
        assert keys["rollout.max_completion_length"] == source["max_completion_length"]
    if "beta" in source:
        assert keys["algo.beta"] == source["beta"]
    if source.get("importance_sampling_level", "").startswith("sequence"):
        assert keys["algo.importance_level"] == "sequence"  # GSPO-token has GSPO's gradient (TRL's gspo_token.md)
    if source.get("use_peft"):
        assert keys["model.lora.enabled"] is True and keys["model.lora.r"] == source.get("lora_r", 16)
    said = " ".join(conversion.ignored + conversion.legacy + conversion.notes + conversion.recipe)
    for name in ("use_liger_kernel", "vllm_enable_sleep_mode", "ds3_gather_for_generation", "accelerate_config",
                 "use_transformers_continuous_batching", "num_processes"):
        if name in source:
            assert f"{name}=" in said, name  # listed as not applicable, with the reason (num_processes: the world size)

    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"prompt": "1+1", "solution": "2"}) + "\n")
    nested = conversion.config_dict()
    nested["model"]["name_or_path"] = tiny_model_dir
    nested.setdefault("data", {}).update(source="jsonl", path=str(data), name=None)
    reward = nested.setdefault("reward", {})
    reward.setdefault("functions", [{"name": "trl.rewards:accuracy_reward", "kind": "trl"}])
    path = tmp_path / "grpolab.yaml"
    path.write_text(yaml.safe_dump(nested))
    assert main(["config", "--config", str(path)]) == 0
    capsys.readouterr()
