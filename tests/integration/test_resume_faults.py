"""Faults at the worst moments, in-process and deterministic: exact resume, signals, non-finite steps.

A kill is simulated by raising ``Killed`` (a BaseException, so nothing of grpolab's catches it) at the
chosen point; whatever the process had written by then is what a SIGKILL would have left.
tests/integration/test_kill_resume.py does the same with real signals on the command line.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import grpolab.commands.train as loop
import grpolab.training.step as step_mod
from grpolab.config import load_config
from grpolab.errors import TrainingError
from grpolab.runtime import checkpoint as ckpt
from grpolab.runtime.logging import RunLogger, read_metrics

STEPS = 5


class Killed(BaseException):
    pass


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: on a shared 2-core machine, 2 threads that spin-wait slow these runs ~10x."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def dataset(addition_jsonl) -> Path:
    return addition_jsonl(32)


def config(model_dir, dataset, out, name, *extra):
    return load_config(
        None,
        [
            f"model.name_or_path={model_dir}",
            f"data.path={dataset}",
            "reward.functions=[{name: exact_match}, {name: 'toy_rewards:digit_fraction'}]",
            "rollout.num_generations=4",
            "rollout.max_completion_length=4",
            "train.prompts_per_step=2",
            f"train.num_steps={STEPS}",
            "train.micro_batch_size=8",
            "optim.lr=1e-3",
            "algo.mu=2",
            f"log.output_dir={out}",
            f"log.run_name={name}",
            "log.checkpoint_every=1",
            "log.keep_last=2",
            "log.progress=false",
            "log.tensorboard=false",
            *extra,
        ],
    )


def comparable(run_dir) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith("sys/")} for row in read_metrics(run_dir)]


@pytest.fixture(scope="module")
def straight(tiny_model_dir, dataset, tmp_path_factory) -> list[dict]:
    result = loop.train(config(tiny_model_dir, dataset, tmp_path_factory.mktemp("runs"), "straight"))
    return comparable(result.run_dir)


def kill_in_torch_save(monkeypatch):
    real, calls = torch.save, []

    def save(obj, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 3:  # step 3's trainer_state.pt: half written, then the process dies
            Path(path).write_bytes(b"PK\x03\x04 partial")
            raise Killed
        return real(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


def kill_between_rename_and_pruning(monkeypatch):
    real = ckpt._fsync_dir

    def fsync(path):
        real(path)
        if path.name == "checkpoints" and (path / "step_3").exists():
            raise Killed  # step_3 is in place, step_1 not yet pruned

    monkeypatch.setattr(ckpt, "_fsync_dir", fsync)


def kill_mid_metrics_row(monkeypatch):
    real = RunLogger.log

    def log(self, step, metrics):
        if step == 3:
            with self.metrics_path.open("a") as fh:
                fh.write('{"step": 3, "train/rew')
            raise Killed
        real(self, step, metrics)

    monkeypatch.setattr(RunLogger, "log", log)


FAULTS = {
    "during torch.save": (kill_in_torch_save, lambda ckpts: ckpts == ["step_1", "step_2"]),
    "between rename and pruning": (kill_between_rename_and_pruning, lambda ckpts: len(ckpts) == 3),
    "mid metrics row": (kill_mid_metrics_row, lambda ckpts: ckpts == ["step_1", "step_2"]),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_kill_at_a_bad_moment_resumes_exactly(
    fault, straight, tiny_model_dir, dataset, tmp_path, monkeypatch
):
    inject, debris_ok = FAULTS[fault]
    cfg = config(tiny_model_dir, dataset, tmp_path, "run")
    with monkeypatch.context() as patch:
        inject(patch)
        with pytest.raises(Killed):
            loop.train(cfg)
    root = ckpt.checkpoint_root(cfg.run_dir)
    assert debris_ok(sorted(p.name for p in root.iterdir() if not p.name.startswith(".")))
    assert ckpt.latest_checkpoint(cfg.run_dir).name != ".tmp_step_3"
    result = loop.train(cfg, resume=True)
    assert result.final_step == STEPS and result.stopped_by is None
    assert comparable(cfg.run_dir) == straight
    assert sorted(p.name for p in root.iterdir()) == ["step_4", "step_5"]  # debris removed, old pruned


def test_sigterm_finishes_the_step_saves_and_returns(
    straight, tiny_model_dir, dataset, tmp_path, monkeypatch
):
    cfg = config(tiny_model_dir, dataset, tmp_path, "run", "log.checkpoint_every=0")
    real, calls = loop.update_policy, []

    def update(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives mid-step 2
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "update_policy", update)
    result = loop.train(cfg)
    assert result.stopped_by == signal.SIGTERM and result.final_step == 2
    assert ckpt.latest_checkpoint(cfg.run_dir).name == "step_2"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handler lives only inside train()
    monkeypatch.setattr(loop, "update_policy", real)
    assert loop.train(cfg, resume=True).final_step == STEPS
    assert comparable(cfg.run_dir) == straight


def test_a_second_sigint_stops_at_once(tiny_model_dir, dataset, tmp_path, monkeypatch):
    cfg = config(tiny_model_dir, dataset, tmp_path, "run")
    real, calls = loop.update_policy, []

    def update(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            signal.raise_signal(signal.SIGINT)  # runs the Python handler before it returns
            signal.raise_signal(signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "update_policy", update)
    # Python's own Ctrl-C handler, which grpolab's must hand the second signal to. A job started in the
    # background by a shell (`make test &`, some CI runners) inherits SIGINT ignored instead.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.train(cfg)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert ckpt.latest_checkpoint(cfg.run_dir).name == "step_1"


def poison_losses_from_step(monkeypatch, first_bad: int) -> None:
    real_update, real_loss, calls = loop.update_policy, step_mod.policy_loss, []

    def update(*args, **kwargs):
        calls.append(1)
        return real_update(*args, **kwargs)

    def loss(*args, **kwargs):
        value, stats = real_loss(*args, **kwargs)
        return (value * float("nan") if len(calls) >= first_bad else value), stats

    monkeypatch.setattr(loop, "update_policy", update)
    monkeypatch.setattr(step_mod, "policy_loss", loss)


def test_nan_losses_skip_updates_then_stop_keeping_good_checkpoints(
    tiny_model_dir, dataset, tmp_path, monkeypatch
):
    cfg = config(tiny_model_dir, dataset, tmp_path, "run", "train.max_bad_steps=3")
    poison_losses_from_step(monkeypatch, first_bad=2)
    with pytest.raises(TrainingError, match=r"steps 2-4: 3 steps in a row had a NaN .* is .*step_3"):
        loop.train(cfg)
    rows = read_metrics(cfg.run_dir)
    assert [r["train/skipped_updates"] for r in rows] == [0.0, 2.0, 2.0, 2.0]  # mu=2 updates each
    assert rows[1]["loss"] is None  # NaN is written as null
    last, before = (
        load_file(ckpt.checkpoint_root(cfg.run_dir) / f"step_{k}/model.safetensors") for k in (3, 2)
    )
    assert all(torch.isfinite(t).all() and torch.equal(t, before[k]) for k, t in last.items())


def test_max_bad_steps_zero_only_skips(tiny_model_dir, dataset, tmp_path, monkeypatch):
    cfg = config(tiny_model_dir, dataset, tmp_path, "run", "train.max_bad_steps=0", "train.num_steps=3")
    poison_losses_from_step(monkeypatch, first_bad=1)
    assert loop.train(cfg).final_step == 3
    assert all(r["train/skipped_updates"] == 2.0 for r in read_metrics(cfg.run_dir))


def test_weights_that_turn_nan_are_never_checkpointed(tiny_model_dir, dataset, tmp_path, monkeypatch):
    cfg = config(tiny_model_dir, dataset, tmp_path, "run")
    real, calls = loop.update_policy, []

    def update(model, *args, **kwargs):
        calls.append(1)
        out = real(model, *args, **kwargs)
        if len(calls) == 2:
            next(model.parameters()).data.fill_(float("inf"))
        return out

    monkeypatch.setattr(loop, "update_policy", update)
    with pytest.raises(TrainingError, match="became NaN or infinite at step 2.*step_1"):
        loop.train(cfg)
    assert [p.name for _, p in ckpt.list_checkpoints(cfg.run_dir)] == ["step_1"]


def test_overwrite_starts_a_fresh_run_over_old_checkpoints(tiny_model_dir, dataset, tmp_path):
    old = ckpt.checkpoint_root(tmp_path / "run") / "step_9"
    old.mkdir(parents=True)
    loop.train(config(tiny_model_dir, dataset, tmp_path, "run", "train.num_steps=1", "log.overwrite=true"))
    assert [p.name for _, p in ckpt.list_checkpoints(tmp_path / "run")] == ["step_1"]
