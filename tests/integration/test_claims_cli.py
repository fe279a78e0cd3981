"""``grpolab claims`` end to end on a tiny model: the warm start, two seeds, every stage; the report holds a verdict
per claim, and a second run reads every stage back instead of redoing it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from grpolab.distributed.host import describe_cpu

VERDICTS = {"held", "not held", "inconclusive"}

REWARD = '''
def has_digit(completions, **kwargs):
    """Right about half the time for a random tiny model: a signal for GRPO and pairs for the reward model."""
    return [float(any(ch.isdigit() for ch in c)) for c in completions]
'''


@pytest.fixture
def claims_config(tmp_path, tiny_model_dir, monkeypatch):
    (tmp_path / "claims_reward.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    path = tmp_path / "claims.yaml"
    path.write_text(f"""
model: {{name_or_path: {tiny_model_dir}, autocast: none}}
data: {{source: arithmetic, size: 90, params: {{digits: 1}}, eval_size: 8}}
rollout: {{num_generations: 4, max_completion_length: 4, temperature: 1.0}}
algo: {{name: grpo, beta: 0.04}}
reward: {{functions: [{{name: "claims_reward:has_digit"}}]}}
optim: {{lr: 1.0e-3}}
train: {{num_steps: 2, prompts_per_step: 2, micro_batch_size: 16}}
eval: {{num_samples: 8, prompts_per_batch: 8, blind_grader: answer_anywhere}}
sft: {{steps: 2, batch_size: 8, lr: 1.0e-3, check_every: 2, dev_size: 6, target_format_errors: 0.0}}
reward_model: {{epochs: 1, batch_size: 8, lr: 1.0e-3, max_length: 32}}
claims: {{group_sizes: [2, 4], hard_params: {{digits: 2}}, eval_prompts: 4, kl_prompts: 2, kl_samples: 4,
          rm_prompts: 24, hacking_betas: [0.0], warm_start: true, seeds: 2}}
log: {{output_dir: {tmp_path / "runs"}, run_name: claims, tensorboard: false, progress: false}}
""")
    return path


def _claims(config, *extra):
    return subprocess.run(
        [sys.executable, "-m", "grpolab", "claims", "-c", str(config), *extra], capture_output=True, text=True, timeout=600
    )


def test_claims_runs_every_stage_writes_a_verdict_per_claim_and_reads_stages_back(claims_config, tmp_path):
    first = _claims(claims_config)
    assert first.returncode == 0, first.stderr[-3000:]
    out = tmp_path / "runs" / "claims"
    report = (out / "claims.md").read_text()
    for i in range(1, 6):
        assert f"\n## {i}. " in report
    summary = json.loads((out / "claims.json").read_text())
    assert set(summary["verdicts"]) == {"1", "2", "3", "4", "5"}
    assert {v["word"] for v in summary["verdicts"].values()} <= VERDICTS
    assert all(m["k3_min"] >= 0 and m["tokens"] > 0 for m in summary["kl"].values())  # k3 is never negative
    for png in ("ppo_vs_grpo", "group_size", "pass_maj_A", "pass_maj_B", "pass_maj_A_reward", "hacking"):
        assert (out / "plots" / f"{png}.png").stat().st_size > 1000
    runs = summary["runs"]
    assert "value" in runs["ppo_s0"]["models_loaded"] and "value" not in runs["grpo_s0"]["models_loaded"]
    assert 0 < runs["ppo_s0"]["params_value"] - runs["grpo_s0"]["params_policy"] <= 1000  # the body and a scalar head
    assert set(runs) == {f"{name}_s{seed}" for name in ("grpo", "ppo", "grpo_G2") for seed in (0, 1)}
    assert all(r["kl_end"] == r["kl_end"] for r in runs.values())  # the KL each trained policy reached, a number
    assert all(r["kl_end"] >= 0 for name, r in runs.items() if name.startswith("grpo"))  # GRPO's k3 is never < 0
    assert summary["reward_model"]["pairs"] > 0
    assert summary["setup"].endswith(describe_cpu())  # the machine each figure was measured on
    assert "seeds 0, 1" in summary["setup"] and "warm start 2 SFT steps" in summary["setup"]
    assert all(v["setup"] == summary["setup"].replace("`", "") for v in summary["verdicts"].values())

    # the warm start: the start of every run, its target (no format error at all) not reached in 2 steps
    warm = summary["warm_start"]
    assert warm["steps"] == 2 and not warm["reached"] and warm["path"] in (out / "grpo_s1.yaml").read_text()
    assert summary["verdicts"]["4"]["word"] == "inconclusive" and "the warm start ran 2 of its 2 steps" in report
    assert "format-blind" in summary["verdicts"]["4"]["sentence"] and "pass@K original, task reward" in report

    second = _claims(claims_config)  # every stage on disk with this config: read back, nothing trained
    assert second.returncode == 0, second.stderr[-3000:]
    assert "training grpo" not in second.stderr and "train-rm:" not in second.stderr and "SFT" not in second.stderr
    assert json.loads((out / "claims.json").read_text())["verdicts"] == summary["verdicts"]


def test_a_group_size_list_without_the_config_s_g_is_one_line_before_any_model_loads(claims_config, capsys):
    """In this process (the test above runs ``python -m grpolab claims``): the verb's check, main()'s line."""
    from grpolab.cli import main

    assert main(["claims", "-c", str(claims_config), "claims.group_sizes=[2, 16]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("grpolab: error: claims.group_sizes=[2, 16] must hold rollout.num_generations=4")
    assert not (claims_config.parent / "runs").exists()  # nothing was written
