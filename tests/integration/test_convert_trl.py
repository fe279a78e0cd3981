"""A TRL user's GRPOConfig, converted by grpolab convert-trl, trains with grpolab train: their YAML and reward
module unchanged, the reward module beside the config (no PYTHONPATH), a dataset without an answer column."""

import json
import sys

import pytest
import yaml

from grpolab.cli import main
from grpolab.runtime.logging import read_metrics

trl = pytest.importorskip("trl")


def test_a_trl_yaml_converts_and_trains(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path.parent)  # not the config's folder: the import must come from load_config
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"prompt": f"{i}+1=", "solution": str(i + 1)}) + "\n"
                                              for i in range(8)))
    (tmp_path / "trl_user_rewards.py").write_text(
        "def brevity(completions, solution, **kwargs):\n"
        "    return [-len(c) / 10 + (c.strip() == s) for c, s in zip(completions, solution)]\n"
    )
    trl_yaml = {
        "model_name_or_path": tiny_model_dir, "dataset_name": str(tmp_path / "d.jsonl"),
        "reward_funcs": ["trl_user_rewards.brevity"], "learning_rate": 1e-4, "num_generations": 4,
        "per_device_train_batch_size": 8, "max_completion_length": 4, "max_steps": 2, "beta": 0.04,
        "bf16": False, "gradient_checkpointing": False, "output_dir": str(tmp_path / "runs" / "trl-run"),
        "report_to": "none",
    }
    (tmp_path / "trl.yaml").write_text(yaml.safe_dump(trl_yaml))
    converted = tmp_path / "grpolab.yaml"
    assert main(["convert-trl", str(tmp_path / "trl.yaml"), "--out", str(converted)]) == 0
    assert main(["--log-level", "ERROR", "train", "--config", str(converted), "log.progress=false"]) == 0
    assert "trained to step 2" in capsys.readouterr().out
    rows = read_metrics(tmp_path / "runs" / "trl-run")
    assert [r["step"] for r in rows] == [1, 2]
    assert (tmp_path / "runs" / "trl-run" / ".lock").read_text() == ""  # a clean exit leaves no holder
