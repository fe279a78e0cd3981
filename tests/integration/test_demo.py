"""`grpolab demo --size tiny` end to end through the CLI: SFT, GRPO, eval, report and plots."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from grpolab.config import ConfigError
from grpolab.commands.demo import demo_config


def test_demo_config_is_package_data_and_a_normal_config(tmp_path):
    cfg = demo_config(tmp_path / "demo")
    assert cfg.run_dir == tmp_path / "demo" and cfg.data.source == "arithmetic"
    assert cfg.sft.target_accuracy is not None and cfg.eval.num_samples == 64
    assert demo_config(tmp_path / "d", "full", ["train.num_steps=7"]).train.num_steps == 7
    with pytest.raises(ConfigError, match="unknown config key"):
        demo_config(tmp_path / "d", "full", ["train.num_stepz=7"])


def test_tiny_demo_writes_a_consistent_report(tmp_path):
    out = tmp_path / "demo"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "grpolab", "demo", "--size", "tiny", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "report.md" in done.stdout and "pass@1" in done.stdout
    # stdout is not a terminal: progress comes as log lines, not a bar, for every phase
    for phase in (r"SFT step \d/4", r"GRPO step 2/2  reward \S+  kl \S+", "eval SFT prompt 6/6", "eval GRPO prompt 6/6"):
        assert re.search(rf"progress: {phase}.* s/\w+  ETA (<= )?\d", done.stderr), (phase, done.stderr[-3000:])

    report = (out / "report.md").read_text()
    assert "What the curves show" in report and "| SFT pass@K |" in report and "| GRPO maj@K |" in report
    for png in ("plots/pass_maj.png", "plots/training.png", "eval/pass_maj.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert (out / "sft" / "model.safetensors").exists() and (out / "checkpoints" / "step_2").is_dir()

    evals = json.loads((out / "eval" / "eval.json").read_text())
    assert [e["label"] for e in evals] == ["SFT", "GRPO"]
    for e in evals:
        passes = [e["pass_at"][k] for k in ("1", "2", "4", "8")]
        assert e["maj_at"]["1"] == pytest.approx(e["pass_at"]["1"])
        assert all(a <= b + 1e-12 for a, b in zip(passes, passes[1:], strict=False))
        assert all(0 <= v <= 1 for v in [*passes, *e["maj_at"].values()])


def test_sft_then_eval_verbs(tiny_model_dir, tmp_path, capsys):
    from grpolab.cli import main

    common = [
        "data.source=arithmetic",
        "data.size=60",
        "data.params={digits: 1}",
        "data.eval_size=5",
        "reward.functions=[{name: exact_match, kwargs: {extract: none}}]",
        "rollout.max_completion_length=3",
        f"log.output_dir={tmp_path}",
        "log.progress=false",
    ]
    sft_args = ["sft.steps=3", "sft.batch_size=4", "sft.target_accuracy=0.99", "sft.dev_size=5"]
    assert main(["sft", f"model.name_or_path={tiny_model_dir}", *common, *sft_args]) == 0
    sft_dir = tmp_path / "run" / "sft"
    assert (sft_dir / "model.safetensors").exists() and "SFT 3 steps" in capsys.readouterr().out
    assert (
        main(["eval", *common, f"eval.checkpoints=[{tiny_model_dir}, {sft_dir}]", "eval.num_samples=4"]) == 0
    )
    assert "pass@1" in capsys.readouterr().out
    evals = json.loads((tmp_path / "run" / "eval" / "eval.json").read_text())
    assert [e["path"] for e in evals] == [tiny_model_dir, str(sft_dir)] and set(evals[1]["maj_at"]) == {
        "1",
        "2",
        "4",
    }
    assert (
        main(["eval", *common, "eval.ks=[8]", "eval.num_samples=4"]) == 2
    )  # a bad config: one line, status 2
    assert "eval.ks" in capsys.readouterr().err
