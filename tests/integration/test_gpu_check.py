"""benchmarks/gpu_check.py, the one prepared GPU check, keeps starting: a --smoke run (the same script, a
tiny model on this CPU) passes its asserts into the table, a run that fails is a row of the table and not
the end of the call, and a run that meets an op with no deterministic kernel is made again without
train.deterministic, with a note naming the op. --keep keeps the runs; a --table that cannot be written
stops the call before any work."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def gpu_check(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # main() prepends the benchmarks folder
    for name in ("CUBLAS_WORKSPACE_CONFIG", "FLASH_ATTENTION_DETERMINISTIC"):  # set by main() and the runs
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)  # undone in reverse: unset again afterwards
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    import gpu_check

    yield gpu_check
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


def test_a_failed_run_is_a_row_and_an_op_without_a_deterministic_kernel_a_retry(gpu_check, monkeypatch, capsys, tmp_path):
    """In process (the torchrun runs call the same train_and_resume in their child): the bf16 run's
    deterministic try meets put_, its retry passes every assert; the fp32 run fails on both tries."""
    import grpolab.commands.train as train_mod
    from grpolab.models.loading import use_deterministic_kernels

    real = train_mod.train

    def train(cfg, **kwargs):
        if cfg.train.deterministic:  # an op on the path with no deterministic kernel (put_, on a CPU)
            use_deterministic_kernels()
            torch.zeros(4).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))
        if cfg.model.dtype == "float32":
            raise RuntimeError("out of memory")
        return real(cfg, **kwargs)

    monkeypatch.setattr(train_mod, "train", train)
    table, runs = tmp_path / "gpu_check.md", tmp_path / "runs"
    argv = ["--smoke", "--only", "bf16,fp32+autocast", "--steps", "3", "--table", str(table), "--keep", str(runs)]
    assert gpu_check.main(argv) == 1
    out = capsys.readouterr().out
    assert table.read_text() in out
    assert sorted(p.name for p in runs.iterdir()) == ["bf16", "bf16_resumed", "data.jsonl", "model"]  # --keep kept
    assert "| fp32+autocast | - |" in out
    bf16 = next(line for line in out.splitlines() if line.startswith("| bf16 | "))
    assert " - " not in bf16 and "0.0e+00" in bf16  # its numbers, and its resume equals the run left alone
    assert "note: bf16 ran with train.deterministic=false: put_ has no deterministic kernel here" in out
    assert out.rstrip().endswith("FAILED:\n- fp32+autocast: RuntimeError: out of memory")


@pytest.mark.parametrize("where", ["missing/gpu_check.md", "a_file/gpu_check.md"])
def test_a_table_that_cannot_be_written_stops_before_any_work(gpu_check, monkeypatch, capsys, tmp_path, where):
    (tmp_path / "a_file").write_text("a file, not a folder")
    monkeypatch.setattr(gpu_check, "matmul_peak_tflops", lambda device: pytest.fail("work started"))
    assert gpu_check.main(["--smoke", "--table", str(tmp_path / where)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"gpu_check: error: {tmp_path / where}: ")
    assert err[0].endswith("give a writable --table file and --keep folder")
