"""convert-trl on what configs in the wild hold: legacy names, fractions of the run, cosine with a floor,
--strict, and hostile values (out of range, YAML alias bombs): each a mapping or one ConfigError line."""

from __future__ import annotations

import math
import re

import pytest

from grpolab.cli import main
from grpolab.errors import ConfigError
from grpolab.training.optim import lr_lambda
from grpolab.trl.convert import convert_trl

pytest.importorskip("trl", reason="convert-trl reads TRL's GRPOConfig fields: pip install 'grpolab[trl]'")
CPU = {"use_cpu": True, "bf16": False}
# 8 completions per device / 4 generations = 2 prompts; max_steps 20 optimizer steps = 20 grpolab steps
RUN = {**CPU, "per_device_train_batch_size": 8, "num_generations": 4, "max_steps": 20}


def test_legacy_names_are_read_under_their_current_name_and_said_so():
    out = convert_trl({**RUN, "torch_dtype": "bfloat16", "warmup_ratio": 0.1, "max_prompt_length": 256,
                       "evaluation_strategy": "no", "overwrite_output_dir": True, "lr_scheduler_type": "linear"})
    assert out.keys["model.dtype"] == "bfloat16" and out.keys["data.max_prompt_length"] == 256
    assert out.keys["optim.warmup_steps"] == 2  # ceil(0.1 x 20 optimizer steps)
    said = "\n".join(out.legacy)
    assert "torch_dtype='bfloat16': read as dtype" in said and "warmup_ratio=0.1: read as warmup_steps" in said
    assert "evaluation_strategy='no': read as eval_strategy" in said and "max_prompt_length=256" in said
    assert any(i.startswith("overwrite_output_dir=True: a legacy name, not applicable") for i in out.ignored)
    assert "# mapped from legacy names:" in out.to_yaml()


def test_a_legacy_name_beside_its_current_one_is_not_read():
    out = convert_trl({**RUN, "warmup_ratio": 0.5, "warmup_steps": 3, "lr_scheduler_type": "linear"})
    assert out.keys["optim.warmup_steps"] == 3
    assert any("warmup_ratio=0.5: not read, warmup_steps=3 is given too" in line for line in out.legacy)


def test_strict_refuses_what_is_only_listed():
    values = {**RUN, "push_to_hub": True, "torch_dtype": "float32"}
    assert convert_trl(values).keys["model.dtype"] == "float32"
    with pytest.raises(ConfigError, match=r"--strict: 2 fields are not converted exactly: push_to_hub=True, torch_dtype"):
        convert_trl(values, strict=True)
    assert convert_trl(RUN, strict=True).keys["train.num_steps"] == 20


def test_fractional_save_and_eval_steps_become_steps_once_the_run_length_is_known():
    out = convert_trl({**RUN, "save_steps": 0.25, "eval_strategy": "steps", "eval_steps": 0.5})
    assert out.keys["log.checkpoint_every"] == 5  # ceil(0.25 x 20)
    assert out.keys["eval.every"] == 10
    epochs = convert_trl({**CPU, "per_device_train_batch_size": 8, "num_generations": 4, "num_train_epochs": 2,
                          "save_steps": 0.1}, dataset_rows=30)
    # 2 epochs x 30 rows / 2 prompts = 30 steps; ceil(0.1 x 30) = 3
    assert (epochs.keys["train.num_steps"], epochs.keys["log.checkpoint_every"]) == (30, 3)
    unknown = convert_trl({**CPU, "save_steps": 0.1})
    assert "log.checkpoint_every" not in unknown.keys
    assert any("save_steps=0.1 is a fraction of the run: pass --dataset-rows" in t for t in unknown.todo)


def test_save_strategy_epoch_saves_every_epoch_of_the_rows():
    out = convert_trl({**CPU, "per_device_train_batch_size": 8, "num_generations": 4, "save_strategy": "epoch"},
                      dataset_rows=9)
    assert out.keys["log.checkpoint_every"] == 5  # ceil(9 rows / 2 prompts)
    assert convert_trl({**CPU, "save_strategy": "epoch"}).keys["log.checkpoint_every"] == 0


def test_cosine_with_min_lr_is_the_cosine_with_a_floor():
    out = convert_trl({**RUN, "lr_scheduler_type": "cosine_with_min_lr", "lr_scheduler_kwargs": {"min_lr_rate": 0.1}})
    assert (out.keys["optim.schedule"], out.keys["optim.min_lr_ratio"]) == ("cosine", 0.1)
    by_lr = convert_trl({**RUN, "learning_rate": 2e-5, "lr_scheduler_type": "cosine_with_min_lr",
                         "lr_scheduler_kwargs": {"min_lr": 2e-6}})
    assert math.isclose(by_lr.keys["optim.min_lr_ratio"], 0.1)
    # transformers: min + (1 - min) * 0.5 * (1 + cos(pi * progress)); at the middle 0.1 + 0.9 * 0.5, at the end 0.1
    assert math.isclose(lr_lambda(5, warmup=0, total=10, schedule="cosine", min_ratio=0.1), 0.55)
    assert math.isclose(lr_lambda(10, warmup=0, total=10, schedule="cosine", min_ratio=0.1), 0.1)
    assert math.isclose(lr_lambda(10, warmup=0, total=10, schedule="cosine"), 0.0, abs_tol=1e-12)
    with pytest.raises(ConfigError, match="lr_scheduler_kwargs.*no grpolab equivalent for linear"):
        convert_trl({**RUN, "lr_scheduler_type": "linear", "lr_scheduler_kwargs": {"min_lr_rate": 0.1}})


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--per_device_train_batch_size", "0"], r"per_device_train_batch_size=0: must be a whole number from 1"),
        (["--num_generations", "-2"], r"num_generations=-2: must be a whole number"),
        (["--steps_per_generation", "0"], r"steps_per_generation=0: must be a whole number"),
        (["--max_steps", "1e400"], r"TRL field max_steps=inf: must be a finite number"),
        (["--learning_rate", "nan"], r"TRL field learning_rate=nan: must be a finite number"),
        (["--delta", "inf"], r"TRL field delta=inf: must be a finite number"),
        (["--max_steps", "99999999999999999999999"], r"max_steps: 9999.* is out of range"),
        (["--max_steps", "1e18"], r"a run of 1000000000000000000 generation batches is out of range"),
        (["--num_train_epochs", "1e300", "--dataset-rows", "10"], r"a run of .* generation batches is out of range"),
        (["--save_steps", "-1"], r"save_steps must be > 0"),
        (["--report_to", "12"], r"report_to=12: not a value TRL takes here"),
        (["--num-processes", "0"], r"--num-processes 0: must be a whole number"),
    ],
)
def test_numbers_out_of_range_are_one_error_line(flags, message, capsys, tmp_path):
    assert main(["convert-trl", *flags, "--use_cpu", "--no_bf16", "--out", str(tmp_path / "o.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("grpolab: error: ")
    assert re.search(message, err[0]), err[0]
    assert not (tmp_path / "o.yaml").exists()


def _bomb(field: str) -> str:
    """A billion laughs under one field: 9^10 strings from ten lines."""
    lines = ["use_cpu: true", "bf16: false", f"{field}:", '  l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"  l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("field", ["generation_kwargs", "model_init_kwargs", "hub_model_id"])
def test_a_yaml_alias_bomb_in_a_field_is_refused_before_anything_walks_it(field, tmp_path, capsys):
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb(field))
    assert main(["convert-trl", "--config", str(path), "--out", str(tmp_path / "o.yaml")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"grpolab: error: TRL field {field}: its value holds more than 10000 nested items")
    assert len(line) < 400


def test_a_large_refused_value_is_named_with_a_bounded_repr():
    with pytest.raises(ConfigError) as err:
        convert_trl({**CPU, "generation_kwargs": {f"k{i}": list(range(50)) for i in range(100)}})
    assert "generation_kwargs=" in str(err.value) and len(str(err.value)) < 600
