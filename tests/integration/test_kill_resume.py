"""Real signals on the command line: SIGKILL mid-step then --resume, and SIGTERM, against a run left alone.

Three runs start together (left alone, to be killed, to be terminated); the two interrupted ones are
then resumed together. Metrics must match the uninterrupted run step for step (sys/ timings aside),
and so must the final weights.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from grpolab.runtime.checkpoint import checkpoint_root
from grpolab.runtime.logging import read_metrics

STEPS = 8


@pytest.fixture(scope="module")
def dataset(addition_jsonl) -> Path:
    return addition_jsonl(32)


def start(model_dir, dataset, out: Path, name: str, *extra: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "grpolab",
        "train",
        f"model.name_or_path={model_dir}",
        f"data.path={dataset}",
        "reward.functions=[{name: exact_match}, {name: 'toy_rewards:digit_fraction'}]",
        "rollout.num_generations=4",
        "rollout.max_completion_length=8",
        "train.prompts_per_step=2",
        f"train.num_steps={STEPS}",
        "optim.lr=1e-3",
        "algo.mu=2",
        f"log.output_dir={out}",
        f"log.run_name={name}",
        "log.checkpoint_every=2",
        "log.keep_last=2",
        "log.progress=false",
        *extra,
    ]
    # One thread each: three runs share two cores, and spin-waiting threads would slow them ~10x.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_for_rows(proc: subprocess.Popen, run_dir: Path, count: int) -> dict:
    """Poll metrics.jsonl until it holds ``count`` rows; return the last one."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        rows = read_metrics(run_dir) if (run_dir / "metrics.jsonl").exists() else []
        if len(rows) >= count:
            return rows[-1]
        time.sleep(0.02)
    raise AssertionError(f"{run_dir} never reached {count} rows")


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err


def comparable(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("sys/")} for r in read_metrics(run_dir)]


def final_weights(run_dir: Path) -> dict:
    return load_file(checkpoint_root(run_dir) / f"step_{STEPS}" / "model.safetensors")


def test_sigkill_mid_step_and_sigterm_then_resume_match_a_run_left_alone(tiny_model_dir, dataset, tmp_path):
    runs = {name: start(tiny_model_dir, dataset, tmp_path, name) for name in ("alone", "killed", "termed")}

    wait_for_rows(runs["termed"], tmp_path / "termed", 1)
    runs["termed"].send_signal(signal.SIGTERM)

    last = wait_for_rows(runs["killed"], tmp_path / "killed", 3)  # step 3 done, step_2 saved
    time.sleep(random.Random(0).uniform(0.2, 0.8) * last["sys/step_time_s"])  # inside the next step
    runs["killed"].send_signal(signal.SIGKILL)
    assert finish(runs["killed"])[0] == -signal.SIGKILL
    code, err = finish(runs["termed"])
    assert code == 128 + signal.SIGTERM, err[-3000:]
    stopped_at = len(read_metrics(tmp_path / "termed"))
    assert 1 <= stopped_at < STEPS
    assert f"grpolab: stopped by SIGTERM after step {stopped_at}; checkpoint saved" in err
    assert (checkpoint_root(tmp_path / "termed") / f"step_{stopped_at}").is_dir()

    resumed = {
        name: start(tiny_model_dir, dataset, tmp_path, name, "--resume") for name in ("killed", "termed")
    }
    code, err = finish(runs["alone"])
    assert code == 0, err[-3000:]
    expected = comparable(tmp_path / "alone")
    assert [r["step"] for r in expected] == list(range(1, STEPS + 1))
    for name, proc in resumed.items():
        code, err = finish(proc)
        assert code == 0, err[-3000:]
        assert comparable(tmp_path / name) == expected, f"{name}: metrics differ from the run left alone"
        alone, other = final_weights(tmp_path / "alone"), final_weights(tmp_path / name)
        assert all((alone[k] == other[k]).all() for k in alone), f"{name}: final weights differ"
        assert not [p for p in checkpoint_root(tmp_path / name).iterdir() if p.name.startswith(".")]
