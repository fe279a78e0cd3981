"""``torchrun --nproc_per_node 2 -m grpolab train`` end to end (gloo, CPU, FSDP2 and DCP checkpoints).

Two jobs start together: one left alone, one whose rank 1 is SIGKILLed after its step-2 checkpoint.
The killed job must exit non-zero within seconds with torchrun's message naming the rank; then
``--resume`` continues it, and its metrics and final weights must match the undisturbed job's. The
final sharded checkpoint is exported (``grpolab export``) to a plain Hugging Face folder, which
``from_pretrained`` loads and which gives the same log-probs as the checkpoint's weights.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from grpolab.runtime.logging import read_metrics

STEPS = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(model_dir, data, out: Path, name: str, *extra: str) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "--monitor_interval", "0.2",
        "-m", "grpolab", "train",
        f"model.name_or_path={model_dir}", "model.autocast=none", f"data.path={data}",
        "reward.functions=[{name: 'toy_rewards:digit_fraction'}]", "rollout.num_generations=2", "rollout.max_completion_length=6",
        "train.prompts_per_step=4", f"train.num_steps={STEPS}", "train.parallel=fsdp", "optim.lr=1e-3",
        f"log.output_dir={out}", f"log.run_name={name}", "log.checkpoint_every=2", "log.keep_last=2",
        "log.progress=false", *extra,
    ]  # fmt: skip
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def workers(launcher: subprocess.Popen) -> list[int]:
    """The pids of the launcher's worker processes (its children)."""
    kids = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()
    return [int(k) for k in kids]


def final_weights(run_dir: Path, out: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """``grpolab export`` of the last checkpoint (the command line's verb, in this process)."""
    from safetensors.torch import load_file

    from grpolab.cli import main

    assert main(["export", str(run_dir / "checkpoints" / f"step_{STEPS}"), str(out)]) == 0
    return load_file(str(out / "model.safetensors")), out


def strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith("sys/")} for r in rows]


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds the workers through /proc")
def test_torchrun_kill_resume_export(tiny_model_dir, addition_jsonl, tmp_path):
    data = addition_jsonl(16)
    alone = torchrun(tiny_model_dir, data, tmp_path, "alone")
    killed = torchrun(tiny_model_dir, data, tmp_path, "killed")
    ckpt = tmp_path / "killed" / "checkpoints" / "step_2"
    deadline = time.monotonic() + 240
    while not ckpt.exists() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ckpt.exists(), killed.communicate()[1][-3000:]
    pids = workers(killed)
    assert len(pids) == 2
    os.kill(pids[-1], signal.SIGKILL)
    t0 = time.monotonic()
    _, err = killed.communicate(timeout=120)
    assert killed.returncode != 0
    assert time.monotonic() - t0 < 30, "the job did not stop within seconds of a rank's death"
    assert "Signal 9 (SIGKILL)" in err and "rank" in err, err[-3000:]

    out, err = alone.communicate(timeout=300)
    assert alone.returncode == 0, err[-3000:]
    resumed = torchrun(tiny_model_dir, data, tmp_path, "killed", "--resume")
    rout, rerr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, rerr[-3000:]

    want, got = read_metrics(tmp_path / "alone"), read_metrics(tmp_path / "killed")
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for a, b in zip(strip(want), strip(got), strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-6, nan_ok=True), (a["step"], k)
    # num_tokens counts both ranks' sequences: per step, 8 prompts of one length plus the 8 completions
    completion = [8 * r["completions/mean_length"] for r in want]
    added = [b["num_tokens"] - a["num_tokens"] for a, b in zip([{"num_tokens": 0}, *want], want, strict=False)]
    prompt = [n - c for n, c in zip(added, completion, strict=True)]
    assert prompt == pytest.approx([prompt[0]] * STEPS, abs=1e-6) and prompt[0] > 0 and round(prompt[0]) % 8 == 0
    w_alone, _ = final_weights(tmp_path / "alone", tmp_path / "export_alone")
    w_killed, folder = final_weights(tmp_path / "killed", tmp_path / "export_killed")
    for k, v in w_alone.items():
        torch.testing.assert_close(w_killed[k], v, atol=1e-6, rtol=1e-5, msg=k)
    _check_export(folder, tiny_model_dir, tmp_path / "alone" / "checkpoints" / f"step_{STEPS}")


def _check_export(folder: Path, start_dir: str, checkpoint: Path) -> None:
    """The exported folder loads with from_pretrained, differs from the start (training moved it) and
    gives the log-probs of the checkpoint's weights loaded by hand from the DCP shards."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpolab.training.logprobs import completion_logprobs

    exported = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    AutoTokenizer.from_pretrained(folder)
    by_hand = AutoModelForCausalLM.from_pretrained(start_dir, dtype=torch.float32)
    state = {"model": by_hand.state_dict()}
    dcp.load(state, checkpoint_id=str(checkpoint / "dcp"))
    by_hand.load_state_dict(state["model"])
    start = AutoModelForCausalLM.from_pretrained(start_dir, dtype=torch.float32)
    prompts = [[5, 6, 7], [8, 9]]
    ids = torch.tensor([[10, 11, 12], [13, 14, 15]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    lp = {name: completion_logprobs(m, prompts, ids, mask, pad_id=0)[0] for name, m in
          (("exported", exported), ("by_hand", by_hand), ("start", start))}  # fmt: skip
    torch.testing.assert_close(lp["exported"], lp["by_hand"], atol=1e-6, rtol=1e-5)
    assert (lp["exported"] - lp["start"]).abs().max() > 1e-4


def test_torchrun_eval_splits_prompts(tiny_model_dir, addition_jsonl, tmp_path):
    """``torchrun -m grpolab eval``: 5 held-out prompts over 2 ranks (3 + 2), one eval.json, the same
    greedy answers as one process, and rank 0's sampled completions equal to one process's (same seed)."""
    import json

    from grpolab.config import load_config
    from grpolab.eval.runner import evaluate

    overrides = [
        f"model.name_or_path={tiny_model_dir}", "model.autocast=none", f"data.path={addition_jsonl(16)}",
        "data.eval_size=5", "eval.num_samples=2", "eval.prompts_per_batch=2", "rollout.max_completion_length=4",
        "reward.functions=[{name: 'toy_rewards:digit_fraction'}]", "log.progress=false",
    ]  # fmt: skip
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "-m", "grpolab", "eval", *overrides, f"eval.output_dir={tmp_path / 'two'}"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 0 samples prompts 0..2 of 5" in done.stderr and "rank 1 samples prompts 3..4 of 5" in done.stderr
    (two,) = json.loads((tmp_path / "two" / "eval.json").read_text())
    (one,) = evaluate(load_config(None, [*overrides, f"eval.output_dir={tmp_path / 'one'}"]))
    assert two["num_prompts"] == one.num_prompts == 5
    assert two["greedy_accuracy"] == pytest.approx(one.greedy_accuracy)
    assert [s["greedy"] for s in two["samples"]] == [s["greedy"] for s in one.samples]
    assert [s["sampled"] for s in two["samples"][:2]] == [s["sampled"] for s in one.samples[:2]]
