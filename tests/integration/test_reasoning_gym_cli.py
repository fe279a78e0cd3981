"""A reasoning-gym task trains through ``grpolab train`` (a subprocess) on the tiny model and logs its reward.

The tiny character tokenizer writes the question's newline as <unk>; the run only has to go through.
"""

from __future__ import annotations

import os
import subprocess
import sys

from grpolab.runtime.logging import read_metrics


def test_chain_sum_trains_through_the_cli(tiny_model_dir, tmp_path):
    cmd = [
        sys.executable, "-m", "grpolab", "--log-level", "WARNING", "train",
        f"model.name_or_path={tiny_model_dir}",
        "data.source=reasoning_gym", "data.name=chain_sum", "data.size=16",
        "data.params={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}",
        "reward.functions=[{name: reasoning_gym}]",
        "rollout.num_generations=2", "rollout.max_completion_length=6",
        "train.prompts_per_step=2", "train.num_steps=2", "optim.lr=1e-3",
        f"log.output_dir={tmp_path}", "log.run_name=gym", "log.progress=false", "log.tensorboard=false",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_metrics(tmp_path / "gym")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0.0 <= r["rewards/reasoning_gym/mean"] <= 1.0 for r in rows)
    assert "State the final answer" in (tmp_path / "gym" / "samples.jsonl").read_text()
