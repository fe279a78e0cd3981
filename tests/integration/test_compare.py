"""`grpolab compare`: GRPO and PPO each in its own process, then a report of models, memory, time and reward."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from grpolab.cli import main
from grpolab.config import load_config
from grpolab.studies.compare import validate_algos


def test_compare_cli_writes_a_report_of_models_memory_and_time(
    tiny_model_dir, addition_jsonl, tmp_path, monkeypatch, capsys
):
    # toy_rewards, in the subprocesses (after the caller's own path, e.g. a worktree's src)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(Path(__file__).parent)])))
    data = addition_jsonl(32)
    overrides = [
        f"model.name_or_path={tiny_model_dir}",
        f"data.path={data}",
        "reward.functions=[{name: exact_match}, {name: 'toy_rewards:digit_fraction'}]",
        "rollout.num_generations=2",
        "rollout.max_completion_length=3",
        "train.prompts_per_step=2",
        "train.num_steps=2",
        "log.tensorboard=false",
        f"log.output_dir={tmp_path}",
        "log.run_name=cmp",
        "algo.beta=0.02",  # set by the user: both algorithms keep it; the rest is each one's preset
    ]
    assert main(["compare", "--algos", "grpo,ppo", *overrides]) == 0
    out = tmp_path / "cmp"
    assert str(out / "report.md") in capsys.readouterr().out
    info = {a: json.loads((out / a / "run_info.json").read_text())["models"] for a in ("grpo", "ppo")}
    assert info["grpo"]["value"] is None and info["ppo"]["value"] > info["ppo"]["policy"] * 0.99
    assert info["grpo"]["policy"] == info["ppo"]["policy"] == info["ppo"]["reference"]
    assert (
        "gae" not in (out / "grpo.yaml").read_text() and "advantage: gae" in (out / "ppo.yaml").read_text()
    )
    assert all("beta: 0.02" in (out / f"{a}.yaml").read_text() for a in ("grpo", "ppo"))
    report = (out / "report.md").read_text()
    assert "| grpo | grpo | seq-mean-token-mean | clip | token | loss | k3 | 0.02 | 0.2 | 0.2 | 1 | 1 |" in report
    assert "| ppo | gae | seq-mean-token-mean | clip | token | reward | k1 | 0.02 | 0.2 | 0.2 | 1 | 2 |" in report
    assert "| grpo | policy, reference |" in report and "| ppo | policy, reference, value |" in report
    assert "value model adds" in report
    for plot in ("reward_vs_step", "reward_vs_samples", "time_per_step"):
        assert (out / "plots" / f"{plot}.png").stat().st_size > 0


def test_compare_rejects_an_unknown_algorithm_before_running(tmp_path):
    cfg = load_config(None, [f"log.output_dir={tmp_path}"])
    with pytest.raises(ValueError, match="unknown algorithm 'ppg'"):
        validate_algos(cfg, ["grpo", "ppg"])
    assert main(["compare", "--algos", "grpo,grpo", f"log.output_dir={tmp_path}"]) == 2
    assert not any(tmp_path.iterdir())
