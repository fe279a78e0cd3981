"""An honest --resume: accepted changes take effect and are recorded, damaged checkpoints are named and
skipped, one run at a time per run dir, and signals (compare's children, before step 1) say what they left."""

from __future__ import annotations

import errno
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml

import grpolab.commands.train as loop
import grpolab.runtime.assemble as assemble_mod
from grpolab.cli import main
from grpolab.config import load_config
from grpolab.runtime import checkpoint as ckpt
from grpolab.runtime.lock import RunDirLocked, hold_run_dir
from grpolab.runtime.logging import read_metrics
from grpolab.studies.compare import CompareStopped, compare


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def overrides(model_dir, dataset, out, *extra) -> list[str]:
    return [
        f"model.name_or_path={model_dir}",
        f"data.path={dataset}",
        "reward.functions=[{name: exact_match}, {name: 'toy_rewards:digit_fraction'}]",
        "rollout.num_generations=2",
        "rollout.max_completion_length=4",
        "train.prompts_per_step=2",
        "train.num_steps=2",
        "optim.lr=1e-3",
        f"log.output_dir={out}",
        "log.run_name=run",
        "log.checkpoint_every=1",
        "log.progress=false",
        "log.tensorboard=false",
        *extra,
    ]


@pytest.fixture(scope="module")
def two_steps(tiny_model_dir, addition_jsonl, tmp_path_factory) -> Path:
    """A two-step run, checkpoints step_1 and step_2, trained at optim.lr=1e-3."""
    out = tmp_path_factory.mktemp("two")
    loop.train(load_config(None, overrides(tiny_model_dir, addition_jsonl(32), out)))
    return out


def copy_run(src: Path, dst: Path) -> None:
    import shutil

    shutil.copytree(src / "run", dst / "run")


def test_resume_with_a_new_lr_trains_at_it_and_records_it(two_steps, tiny_model_dir, addition_jsonl, tmp_path):
    copy_run(two_steps, tmp_path)
    extra = ("train.num_steps=3", "optim.lr=1e-5")
    cfg = load_config(None, overrides(tiny_model_dir, addition_jsonl(32), tmp_path, *extra))
    assert loop.train(cfg, resume=True).final_step == 3
    rows = read_metrics(cfg.run_dir)
    assert rows[1]["learning_rate"] == pytest.approx(1e-3) and rows[2]["learning_rate"] == pytest.approx(1e-5)
    assert yaml.safe_load((cfg.run_dir / "config.yaml").read_text())["optim"]["lr"] == pytest.approx(1e-5)
    saved = yaml.safe_load((cfg.run_dir / "checkpoints/step_3/config.yaml").read_text())
    assert saved["optim"]["lr"] == pytest.approx(1e-5)
    record = json.loads((cfg.run_dir / "resumes.jsonl").read_text().splitlines()[-1])
    assert record["step"] == 2 and record["changes"]["optim.lr"] == {"saved": 1e-3, "now": 1e-5}
    assert record["changes"]["train.num_steps"] == {"saved": 2, "now": 3}


def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(
    two_steps, tiny_model_dir, addition_jsonl, tmp_path, caplog
):
    copy_run(two_steps, tmp_path)
    weights = tmp_path / "run/checkpoints/step_2/model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # a disk that filled up mid-copy
    cfg = load_config(None, overrides(tiny_model_dir, addition_jsonl(32), tmp_path))
    with caplog.at_level("WARNING"):
        result = loop.train(cfg, resume=True)
    assert "step_2 is damaged (model.safetensors has 100 bytes" in caplog.text
    assert f"resuming from {cfg.run_dir / 'checkpoints' / 'step_1'} instead" in caplog.text
    assert result.final_step == 2 and [r["step"] for r in read_metrics(cfg.run_dir)] == [1, 2]
    assert ckpt.verify_checkpoint(ckpt.latest_checkpoint(cfg.run_dir)) is None  # step_2 rewritten, intact


def test_a_second_run_on_a_locked_run_dir_is_refused_and_a_stale_lock_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    with hold_run_dir(run_dir) as me, pytest.raises(RunDirLocked) as err, hold_run_dir(run_dir):
        pass
    assert f"is in use by another run (pid {me['pid']} on {me['host']}" in str(err.value)
    (run_dir / ".lock").write_text(json.dumps({"pid": 999999999, "host": "gone"}))  # its process died
    with hold_run_dir(run_dir) as again:
        assert json.loads((run_dir / ".lock").read_text())["pid"] == again["pid"] == os.getpid()


def test_a_locked_run_dir_stops_train_before_anything_is_touched(
    two_steps, tiny_model_dir, addition_jsonl, tmp_path, monkeypatch
):
    copy_run(two_steps, tmp_path)
    debris = tmp_path / "run/checkpoints/.tmp_step_3"
    debris.mkdir()  # the other run's checkpoint being written: must not be "cleaned up"
    cfg = load_config(None, overrides(tiny_model_dir, addition_jsonl(32), tmp_path, "train.num_steps=3"))
    with hold_run_dir(cfg.run_dir), pytest.raises(RunDirLocked, match="in use by another run"):
        loop.train(cfg, resume=True)
    assert debris.exists() and len(read_metrics(cfg.run_dir)) == 2


def test_sigint_before_step_1_says_no_checkpoint_was_written(
    tiny_model_dir, addition_jsonl, tmp_path, monkeypatch, capsys
):
    real = assemble_mod.load_policy

    def load_then_interrupt(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the model loads
        return real(*args, **kwargs)

    monkeypatch.setattr(assemble_mod, "load_policy", load_then_interrupt)
    code = main(["--log-level", "ERROR", "train", *overrides(tiny_model_dir, addition_jsonl(32), tmp_path)])
    err = capsys.readouterr().err
    assert code == 130
    assert "grpolab: stopped by SIGINT before step 1; no checkpoint was written" in err
    assert "checkpoint saved" not in err and ckpt.latest_checkpoint(tmp_path / "run") is None


def test_a_full_disk_is_one_line(monkeypatch, tmp_path, capsys):
    def full(cfg, *, resume=False):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run/metrics.jsonl"))

    monkeypatch.setattr(loop, "train", full)
    assert main(["train", f"log.output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("grpolab: error: No space left on device writing ") and "\n" not in err


def test_a_bad_log_level_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--log-level", "bogus", "config"])
    assert exit_.value.code == 2
    assert "grpolab: error: argument --log-level: invalid choice: 'BOGUS'" in capsys.readouterr().err


def test_resume_allow_change_needs_resume(capsys):
    assert main(["train", "--resume-allow-change", "seed"]) == 2
    assert "--resume-allow-change only applies with --resume" in capsys.readouterr().err


def test_sigint_reaches_the_compare_child_which_saves_before_exit(
    tiny_model_dir, addition_jsonl, tmp_path, monkeypatch
):
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    )
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg = load_config(
        None, overrides(tiny_model_dir, addition_jsonl(32), tmp_path, "train.num_steps=200", "log.checkpoint_every=0")
    )
    metrics = tmp_path / "run" / "grpo" / "metrics.jsonl"

    def interrupt_after_step_1() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().strip()):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C at the terminal sends this process

    threading.Thread(target=interrupt_after_step_1, daemon=True).start()
    with pytest.raises(CompareStopped) as stopped:
        compare(cfg, ["grpo", "ppo"])
    assert stopped.value.signum == signal.SIGINT and stopped.value.algo == "grpo"
    assert stopped.value.skipped == ["ppo"]
    last = ckpt.latest_checkpoint(tmp_path / "run" / "grpo")
    assert last is not None and ckpt.verify_checkpoint(last) is None  # saved, intact, before the child exited
    assert int(last.name.removeprefix("step_")) == len(read_metrics(tmp_path / "run" / "grpo")) < 200
    assert "stopped by SIGINT" in (tmp_path / "run" / "grpo.log").read_text()
    assert not (tmp_path / "run" / "ppo").exists()
