"""A signal to ``compare`` / ``claims`` reaches the training process they run (SIGHUP too: a closed terminal),
and the verb then ends with one line and 128 + the signal, not a traceback (studies/compare.py, cli.py)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from grpolab.studies import claims
from grpolab.studies.compare import CompareStopped, _forward_signals

CHILD = """
import signal, sys, time
signal.signal(signal.SIGHUP, lambda *_: sys.exit(128 + signal.SIGHUP))  # as train's GracefulStop ends it
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM])
def test_a_signal_goes_to_the_training_process_and_the_handlers_come_back(signum):
    before = signal.getsignal(signum)
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert child.stdout.readline() == "ready\n"
        with _forward_signals(child) as received:
            signal.raise_signal(signum)  # this process survives: the handler passes it on
            code = child.wait(timeout=60)
        assert received == [signum]
        assert code == (128 + signal.SIGHUP if signum == signal.SIGHUP else -signal.SIGTERM)
        assert signal.getsignal(signum) == before
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_claims_stopped_in_a_training_stage_is_one_line_and_128_plus_the_signal(signum, tmp_path, monkeypatch, capsys):
    from grpolab.cli import main

    def stopped(cfg):
        raise CompareStopped(signum, "ppo", tmp_path / "ppo", [])

    monkeypatch.setattr(claims, "run_claims", stopped)
    assert main(["claims", f"log.output_dir={tmp_path}"]) == 128 + signum
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"grpolab: claims stopped by {signal.Signals(signum).name} during ppo (it had written no checkpoint yet); "
        "every finished stage is kept and read back: run the same command again"
    ]
