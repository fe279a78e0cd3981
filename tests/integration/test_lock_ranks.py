"""A second torchrun job on a locked run dir stops on every rank with one message (gloo, 2 processes).

Before, rank 0 alone took the lock and raised; rank 1 went on to its next collective and died in gloo
with a traceback. (A free run dir under 2 ranks: tests/integration/test_torchrun.py trains through it.)
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch.multiprocessing as mp

from grpolab.runtime.lock import hold_run_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, world: int, port: int, run_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    from grpolab.distributed import dist
    from grpolab.runtime.lock import RunDirLocked, hold_run_dir_for_job

    try:
        with dist.session("cpu", timeout_s=60), hold_run_dir_for_job(run_dir):
            dist.barrier()  # the job goes on together
            result = "held"
    except RunDirLocked as err:
        result = f"locked: {err}"
    Path(out, f"rank{rank}.txt").write_text(result)


def run_job(run_dir: Path, out: Path) -> list[str]:
    out.mkdir()
    mp.start_processes(worker, args=(2, free_port(), str(run_dir), str(out)), nprocs=2, join=True,
                       start_method="spawn")
    return [(out / f"rank{r}.txt").read_text() for r in range(2)]


def test_a_locked_run_dir_stops_every_rank_with_one_message(tmp_path):
    run_dir = tmp_path / "run"
    with hold_run_dir(run_dir) as holder:  # another run holds it
        rank0, rank1 = run_job(run_dir, tmp_path / "locked")
    assert rank0.startswith(f"locked: {run_dir} is in use by another run (pid {holder['pid']}")
    assert rank1.startswith(f"locked: rank 0 could not take the run directory: {run_dir} is in use by another run")
