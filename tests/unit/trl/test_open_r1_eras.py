"""open-r1's GRPO recipes of every era through grpolab convert-trl: the five recipes of tests/data/open_r1_eras
(written in the style of open-r1's recipes at the commits their comments name) convert to configs grpolab
accepts, with the values open-r1 trained them with, computed by hand below; every field open-r1's script
classes have had is known; the recipe's own num_processes is the world size unless the caller gives one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from grpolab.cli import main
from grpolab.config import config_from_dict
from grpolab.errors import ConfigError
from grpolab.rewards import open_r1 as rewards
from grpolab.trl.convert import SCRIPT_FIELDS, TRL_FIELDS, convert_trl
from grpolab.trl.open_r1 import EARLY_SYSTEM_PROMPT

pytest.importorskip("trl", reason="convert-trl reads TRL's GRPOConfig fields: pip install 'grpolab[trl]'")
ERAS = Path(__file__).parents[2] / "data" / "open_r1_eras"
CPU = {"use_cpu": True, "bf16": False}
OWN = "grpolab.rewards.open_r1:"


def _convert(name: str, **kwargs):
    out = convert_trl(ERAS / f"{name}.yaml", **kwargs)
    config_from_dict(out.config_dict())  # convert_trl validates too; the test says so itself
    return out


def _said(lines: list[str], start: str) -> str:
    found = [line for line in lines if line.startswith(start)]
    assert len(found) == 1, (start, lines)
    return found[0]


def test_first_recipes_dataset_configs_list_and_the_files_process_count():
    out = _convert("1_first", dataset_rows=140)
    k = out.keys
    # 7 processes from the file: 1 completion x 7 x 16 accumulation = 112 = 14 prompts x 8 (TRL's num_generations)
    assert (k["train.prompts_per_step"], k["rollout.num_generations"], k["algo.num_minibatches"]) == (14, 8, 1)
    assert k["train.num_steps"] == 10 and k["optim.warmup_steps"] == 1  # 140 rows / 14; ceil(0.1 x 10)
    assert "num_processes=7: the recipe's own process count is the world size" in out.recipe[0]
    # [all] was never read (grpo.py loaded dataset_config, unset): no data.name, and listed with the reason
    assert "data.name" not in k and k["data.path"] == "org/math-tir"
    assert _said(out.ignored, "dataset_configs=['all']: ").endswith("a dataset's config is dataset_config (data.name)")
    # open-r1's grpo.py of the time: the problem column, its built-in system turn, [accuracy, format]
    assert (k["data.prompt_field"], k["data.chat_template"], k["data.system_prompt"]) == ("problem", True, EARLY_SYSTEM_PROMPT)
    assert [f["name"] for f in k["reward.functions"]] == [OWN + "accuracy_reward", OWN + "format_reward_spaced"]
    # TRL of the time: beta 0.04, temperature 0.9, each completion's token mean
    assert (k["algo.beta"], k["rollout.temperature"], k["algo.loss_agg"]) == (0.04, 0.9, "seq-mean-token-mean")
    assert (k["rollout.max_completion_length"], k["data.max_prompt_length"], k["optim.lr"]) == (1024, 512, 2e-05)
    assert "counted it in prompts" in _said(out.recipe, "per_device_train_batch_size: ")
    assert any(line.startswith("vllm_device='auto'") for line in out.ignored)


def test_the_callers_process_count_wins_over_the_files_and_says_so():
    out = _convert("1_first", num_processes=14, dataset_rows=140)
    assert out.keys["train.prompts_per_step"] == 28  # 1 x 14 x 16 = 224 completions / 8
    assert out.recipe[0] == "num_processes=7: the recipe's process count, not used: --num-processes 14 is"
    assert not any(line.startswith("num_processes") for line in _convert("1_first", num_processes=7).recipe)


def test_reward_arguments_of_february_2025():
    out = _convert("2_reward_args", dataset_rows=512)
    k = out.keys
    # 16 completions x 7 processes x 16 = 1792 = 256 prompts x 7 generations; 512 rows / 256
    assert (k["train.prompts_per_step"], k["train.num_steps"], k["train.micro_batch_size"]) == (256, 2, 16)
    specs = k["reward.functions"]
    assert [(s["name"], s["weight"]) for s in specs] == [
        (OWN + "accuracy_reward", 1.0), (OWN + "format_reward_spaced", 1.0), (OWN + "cosine_reward", 0.5),
        (OWN + "repetition_penalty_reward", 0.25),
    ]
    assert specs[2]["kwargs"] == {"cosine": {"min_value_wrong": -1.0, "max_value_wrong": -0.5, "min_value_correct": 0.5,
                                             "max_value_correct": 1.0, "max_len": 800}}
    assert specs[3]["kwargs"] == {"ngram_size": 4, "max_penalty": -0.5}
    assert k["data.system_prompt"] == EARLY_SYSTEM_PROMPT and k["algo.loss_agg"] == "seq-mean-token-mean"
    assert not any(line.startswith("reward_funcs=") for line in out.recipe)  # the recipe names them


def test_system_prompt_era_keeps_its_prompt_and_the_newline_format():
    out = _convert("3_system_prompt", dataset_rows=64)
    k = out.keys
    # 16 x 1 process x 4 = 64 completions = 4 prompts x 16; 64 rows / 4 = 16 steps, an epoch each save
    assert (k["train.prompts_per_step"], k["train.num_steps"], k["log.checkpoint_every"]) == (4, 16, 16)
    assert (k["optim.warmup_steps"], k["optim.min_lr_ratio"], k["log.keep_last"]) == (2, 0.1, 1)
    assert k["data.system_prompt"].startswith("Reason first") and k["data.prompt_field"] == "problem"
    assert [f["name"] for f in k["reward.functions"]] == [OWN + "accuracy_reward", OWN + "format_reward", OWN + "tag_count_reward"]
    assert (k["algo.beta"], k["rollout.temperature"]) == (0.04, 0.9)
    # TRL's bnpo: each micro-batch of 16 completions divided by its own tokens, and said so
    assert (k["algo.loss_agg"], k["algo.loss_agg_batch_rows"]) == ("batch-token-mean", 16)
    assert "micro-batch" in _said(out.recipe, "loss_type=bnpo: unset")
    assert "format_reward_spaced" in _said(out.recipe, "reward format: ")


def test_named_prompt_column_and_code_reward_on_the_launchs_7_processes():
    with pytest.raises(ConfigError, match=r"with 1 process: generation_batch_size 64 is not a multiple of num_generations 14; it fits 7"):
        _convert("4_prompt_column")
    out = _convert("4_prompt_column", num_processes=7)
    k = out.keys
    assert (k["train.prompts_per_step"], k["train.num_steps"]) == (32, 50)  # 16 x 7 x 4 = 448 / 14; max_steps 50
    assert (k["data.prompt_field"], k["data.chat_template"], k["algo.beta"], k["rollout.temperature"]) == (
        "problem_statement", True, 0.01, 1.0)
    code, fmt = k["reward.functions"]
    assert code == {"name": "open_r1.rewards:code_reward", "kind": "trl", "weight": 1.0,
                    "kwargs": {"num_parallel": 4, "provider_type": "e2b", "enforce_same_language": False}}
    assert (fmt["name"], fmt["weight"]) == (OWN + "format_reward", 0.1)
    assert not any(line.startswith("beta=") for line in out.recipe)  # every TRL default it reads is given
    assert "top_k 50" in _said(out.recipe, "top_k unset: ")


def test_codeforces_era():
    out = _convert("5_codeforces")
    k = out.keys
    assert (k["train.prompts_per_step"], k["train.num_steps"]) == (8, 20)  # 4 x 1 x 32 = 128 / 16
    assert (k["data.name"], k["data.prompt_field"], k["data.chat_template"]) == ("verifiable-prompts", "prompt", True)
    assert (k["algo.beta"], k["algo.advantage"], k["algo.loss_agg"]) == (0.0, "dr_grpo", "seq-mean-token-sum-norm")
    assert k["algo.mask_truncated"] is True and k["log.project"] == "tiny-r1"
    assert [(s["name"], s.get("kwargs"), s["weight"]) for s in k["reward.functions"]] == [
        ("open_r1.rewards:cf_code_reward", {"test_batch_size": -1, "scoring_mode": "weighted_sum"}, 1.0),
        (OWN + "code_format_reward", {"language": "python"}, 0.1),
        ("soft_overlong", {"max_length": 8192, "cache_length": 1024}, 0.5),
    ]
    assert [line.split(":")[0] for line in out.recipe] == ["top_k unset"]
    ignored = " ".join(out.ignored)
    assert "wandb_log_unique_prompts=False" in ignored and "benchmarks=['lcb_v4']" in ignored


def test_the_cli_takes_the_files_process_count(tmp_path, capsys):
    written = tmp_path / "grpolab.yaml"
    assert main(["convert-trl", str(ERAS / "1_first.yaml"), "--dataset-rows", "140", "--out", str(written)]) == 0
    text = written.read_text()
    assert "# from the recipe's script and era:\n#   - num_processes=7: " in text
    assert yaml.safe_load(text)["train"]["prompts_per_step"] == 14
    capsys.readouterr()


# every field open-r1's ScriptArguments / GRPOScriptArguments / GRPOConfig additions have had (b47b1d0 to
# 1416fa0), trl.ScriptArguments' of the TRL versions it pinned, and the keys its early recipes carried
OPEN_R1_EVER = (
    "reward_funcs", "benchmarks", "callbacks", "system_prompt", "hub_model_revision", "overwrite_hub_revision",
    "push_to_hub_revision", "cosine_min_value_wrong", "cosine_max_value_wrong", "cosine_min_value_correct",
    "cosine_max_value_correct", "cosine_max_len", "repetition_n_grams", "repetition_max_penalty", "wandb_entity",
    "wandb_project", "reward_weights", "chat_template", "code_language", "code_eval_test_batch_size",
    "dataset_prompt_column", "parallel_code_exec_per_proc", "wandb_run_group", "e2b_router_url", "morph_router_url",
    "code_provider", "ioi_provider", "max_completion_len", "soft_punish_cache", "dataset_name", "dataset_mixture",
    "code_eval_scoring_mode", "num_completions_to_print", "wandb_log_unique_prompts", "dataset_config",
    "dataset_train_split", "dataset_test_split", "gradient_checkpointing_use_reentrant", "ignore_bias_buffers",
    "dataset_streaming", "dataset_configs", "num_processes",
)


def test_every_field_open_r1s_script_has_had_is_known():
    assert [name for name in OPEN_R1_EVER if name not in SCRIPT_FIELDS and name not in TRL_FIELDS] == []


def test_a_dataset_mixture_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match=r"dataset_mixture=\{'datasets'.*grpolab trains on one dataset"):
        convert_trl({**CPU, "reward_funcs": ["accuracy"], "dataset_mixture": {"datasets": [{"id": "a"}, {"id": "b"}]}})


def test_a_trl_cli_config_with_num_processes_is_not_read_as_open_r1():
    out = convert_trl({**CPU, "num_processes": 4, "per_device_train_batch_size": 2, "num_generations": 8, "max_steps": 3})
    assert out.keys["train.prompts_per_step"] == 1  # 2 x 4 processes = 8 completions = 1 prompt x 8
    assert out.keys["algo.beta"] == 0.0  # TRL 1.16's default: no open-r1 era filled in
    assert [line.split(":")[0] for line in out.recipe] == ["num_processes=4"]


@pytest.mark.parametrize("value", [0, True, "seven", 2**20])
def test_a_bad_process_count_in_the_file_is_one_line(value):
    with pytest.raises(ConfigError, match=r"num_processes=.*: the recipe's process count must be a whole number"):
        convert_trl({**CPU, "num_processes": value})


@pytest.mark.parametrize(("field", "value", "says"), [
    ("use_dora", True, "grpolab trains plain LoRA adapters on lora_target_modules (model.lora) (no DoRA)"),
    ("load_in_4bit", True, "it has no bitsandbytes loading"),
    ("lora_modules_to_save", ["lm_head"], "no module is trained in full beside them"),
])
def test_model_config_fields_grpolab_lacks_are_refused(field, value, says):
    with pytest.raises(ConfigError, match=f"{field}=.*{says}".replace("(", r"\(").replace(")", r"\)")):
        convert_trl({**CPU, field: value})


def test_bnb_settings_alone_are_listed_not_refused():
    out = convert_trl({**CPU, "bnb_4bit_quant_type": "fp4"})
    assert any(line.startswith("bnb_4bit_quant_type='fp4': read only with load_in_4bit") for line in out.ignored)


@pytest.mark.parametrize(("text", "now", "spaced", "inline"), [
    ("<think>\nr\n</think>\n<answer>\n4\n</answer>", 1.0, 1.0, 0.0),  # 566cfd1 on: the newlines
    ("<think> r </think><answer> 4 </answer>", 0.0, 1.0, 1.0),  # the early system prompt's example
    ("<think>a\nb</think>\n<answer>4</answer>", 0.0, 1.0, 0.0),  # d12886d's DOTALL and \s*
    ("the answer is 4", 0.0, 0.0, 0.0),
])
def test_open_r1s_three_format_rewards(text, now, spaced, inline):
    chat = [[{"role": "assistant", "content": text}]]
    assert (rewards.format_reward(chat), rewards.format_reward_spaced(chat), rewards.format_reward_inline([text])) == (
        [now], [spaced], [inline])


def test_wandb_project_names_the_one_project_over_trls_trackio_default():
    assert convert_trl({**CPU, "wandb_project": "w"}).keys["log.project"] == "w"  # TRL's project: "huggingface"
    out = convert_trl({**CPU, "project": "p", "wandb_project": "w"})
    assert out.keys["log.project"] == "w"
    assert "project='p', wandb_project='w': grpolab's trackers share one project" in " ".join(out.notes)
    assert convert_trl({**CPU, "project": "p"}).keys["log.project"] == "p"
