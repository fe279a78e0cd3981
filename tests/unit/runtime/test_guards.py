"""The no-signal guard, the stop signals and the sampling guard (runtime/guards.py)."""

from __future__ import annotations

import logging
import signal

import pytest
import torch

from grpolab.config import load_config
from grpolab.errors import TrainingError
from grpolab.runtime.guards import GracefulStop, NoSignal, sampling_guard, weights_finite
from grpolab.training.failures import FailedGroups

FLAT = {"train/reward_valid_frac": 1.0, "frac_reward_zero_std": 1.0, "reward_std": 0.0}
SIGNAL = {"train/reward_valid_frac": 1.0, "frac_reward_zero_std": 0.5, "reward_std": 0.4}


def test_no_signal_warns_at_3_and_stops_at_the_limit_and_a_signal_resets_it(caplog):
    guard = NoSignal(5, group_baseline=True)
    with caplog.at_level(logging.WARNING):
        for step in (1, 2):
            guard.observe(step, FLAT)
        assert caplog.text == ""
        guard.observe(3, FLAT)
        assert "steps 1-3: no learning signal, every completion of every group got the same reward" in caplog.text
        guard.observe(4, SIGNAL)
        assert guard.in_a_row == 0
        for step in range(5, 9):
            guard.observe(step, FLAT)
        with pytest.raises(TrainingError, match=r"steps 5-9: 5 steps in a row carried no learning signal"):
            guard.observe(9, FLAT)


def test_without_a_limit_the_guard_warns_once_and_the_run_goes_on(caplog):
    never = NoSignal(0, group_baseline=True)
    with caplog.at_level(logging.WARNING):
        for step in range(1, 100):
            never.observe(step, FLAT)
    (record,) = caplog.records
    assert record.getMessage().startswith("steps 1-3: no learning signal")
    assert record.getMessage().endswith("The run goes on (train.max_no_signal_steps=0: never stop).")


def test_no_signal_reads_valid_frac_first_and_reward_std_for_a_learned_baseline():
    assert not NoSignal(0, group_baseline=False).has_signal({**SIGNAL, "train/reward_valid_frac": 0.0})
    ppo = NoSignal(0, group_baseline=False)
    assert ppo.has_signal({**FLAT, "reward_std": 0.1})  # zero-std groups, a value baseline: still signal
    assert not ppo.has_signal(FLAT)
    never = NoSignal(0, group_baseline=True)
    for step in range(1, 100):
        never.observe(step, FLAT)  # 0 = never stop
    assert never.in_a_row == 99


def test_no_signal_from_config_picks_the_baseline_and_skips_process_supervision():
    assert NoSignal.from_config(load_config(None, [])).group_baseline
    ppo = NoSignal.from_config(load_config(None, ["algo.name=ppo", "train.max_no_signal_steps=7"]))
    assert not ppo.group_baseline and ppo.limit == 7
    process = NoSignal.from_config(
        load_config(None, ["algo.supervision=process", "reward.process={name: 'my_module:steps'}"])
    )
    for step in range(1, 200):
        process.observe(step, FLAT)  # outcome metrics do not see the step rewards: never judged
    assert process.in_a_row == 0


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_asks_for_a_checkpoint_and_the_handlers_are_restored(signum):
    """SIGHUP too (a closed ssh session): the run saves and stops as on Ctrl-C, instead of dying mid-step."""
    before = signal.getsignal(signum)
    with GracefulStop() as stop:
        signal.raise_signal(signum)  # the Python handler runs before raise_signal returns
        assert stop.signum == signum
    assert signal.getsignal(signum) == before


HUNG_UP = """
import sys, time
from grpolab.runtime.guards import GracefulStop
with GracefulStop() as stop:
    print("ready", flush=True)
    while not stop.requested:
        time.sleep(0.01)
    for _ in range(50):
        print("a progress line, to the terminal that hung up", flush=True)
    open(sys.argv[1], "w").write("the checkpoint")
sys.exit(128 + stop.signum)
"""


def test_after_sighup_the_step_still_ends_and_saves_though_the_terminal_is_gone(tmp_path):
    """A write to a hung-up terminal fails (EIO): the progress lines after SIGHUP must not end the run."""
    import os
    import pty
    import subprocess
    import sys

    master, terminal = pty.openpty()
    saved = tmp_path / "saved"
    run = subprocess.Popen([sys.executable, "-c", HUNG_UP, str(saved)], stdin=terminal, stdout=terminal, stderr=terminal)
    os.close(terminal)
    try:
        seen = b""
        while b"ready" not in seen:
            seen += os.read(master, 1024)
        os.close(master)  # the terminal goes: every write to it fails from now on
        run.send_signal(signal.SIGHUP)
        assert run.wait(timeout=60) == 128 + signal.SIGHUP
        assert saved.read_text() == "the checkpoint"
    finally:
        run.kill()
        run.wait()


def test_too_many_failed_groups_name_the_step_and_the_last_good_checkpoint(tmp_path):
    with pytest.raises(TrainingError) as err, sampling_guard("tiny", 7, tmp_path):
        raise FailedGroups("5 of 8 groups (62%) were dropped for failed samples (env_error 5; the first: x)")
    assert str(err.value) == (
        "step 7: 5 of 8 groups (62%) were dropped for failed samples (env_error 5; the first: x); nothing of this "
        "step was logged or saved, and no checkpoint was written yet"
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_weights_finite_finds_one_nan_or_infinity_and_not_an_overflowing_sum(dtype):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)).to(dtype)
    assert weights_finite(model)
    big = torch.finfo(dtype).max
    with torch.no_grad():
        model[1].weight.fill_(big)  # every element finite, the sum beyond the dtype's (fp16: and fp32's) range
        assert weights_finite(model)
        for bad in (float("nan"), float("inf"), -float("inf")):
            model[0].weight[2, 1] = bad
            assert not weights_finite(model)
            model[0].weight[2, 1] = 0.5
        model[1].weight[0, 0] = float("nan")  # beside the huge finite values
        assert not weights_finite(model)
        model[1].weight[0, 0] = 1.0
        model[1].weight.requires_grad_(False)  # only trainable parameters are checked
        model[1].weight[0, 0] = float("nan")
        assert weights_finite(model)
