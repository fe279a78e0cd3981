"""Shared fixtures: tiny models and tokenizers built in code and saved to a temporary folder (no network)."""

from __future__ import annotations

import json
import os
from pathlib import Path

# Before torch loads (and inherited by every child process the tests start): OpenMP threads that sleep
# instead of spinning when idle, as `grpolab demo` sets for itself (cli.py). Results do not change, only the
# waiting: on a 2-core CPU shared with a child (a vLLM server, a torchrun job, another run) the default
# spin-wait made a 2-thread forward pass 20-80x slower.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# OMP_NUM_THREADS=1 runs the suite single-threaded (reduction orders change with the thread count).
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A saved Qwen2-architecture model (hidden 64, 2 layers) with a character tokenizer."""
    from grpolab.tasks.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny_model"), hidden_size=64, num_layers=2, num_heads=4)


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory) -> str:
    """The vLLM integration tests' model (hidden 64, 2 layers, 2 heads), one folder for their modules: an
    engine is kept for the process, keyed by its settings and the model's path (rollout/vllm/engine.py,
    start_engine), so a colocated run of one module (test_server_mode.py) and the next (test_vllm_train.py)
    share one engine start."""
    from grpolab.tasks.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("vllm_tiny"), hidden_size=64, num_layers=2, num_heads=2)


@pytest.fixture(scope="session")
def addition_jsonl(tmp_path_factory):
    """Factory: ``addition_jsonl(size)`` is a JSONL file of ``size`` one-digit addition problems
    (rows with "prompt" and "answer", seed 0), written once per size."""
    from grpolab.tasks.arithmetic import arithmetic_examples

    made: dict[int, Path] = {}

    def make(size: int) -> Path:
        if size not in made:
            path = tmp_path_factory.mktemp("data") / f"add{size}.jsonl"
            rows = [
                {"prompt": e.prompt, "answer": e.answer}
                for e in arithmetic_examples(size=size, seed=0, digits=1)
            ]
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            made[size] = path
        return made[size]

    return make


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    """wandb in offline mode with every folder under tmp_path and login forbidden; returns a reader of
    what was written (tests/tracker_records.py)."""
    wandb = pytest.importorskip("wandb")
    from tracker_records import WandbRecords

    root = tmp_path / "wandb_home"
    for var, sub in (("WANDB_DIR", ""), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"), ("WANDB_DATA_DIR", "data")):
        (root / sub).mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(var, str(root / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)

    def no_login(*args, **kwargs):
        raise AssertionError("wandb tried to log in; the tests run offline")

    monkeypatch.setattr(wandb, "login", no_login)
    yield WandbRecords(root)
    wandb.teardown()  # wandb keeps its first settings (folders, mode) for the process otherwise


@pytest.fixture(scope="session")
def trackio_dir(tmp_path_factory):
    """trackio's local store in a temporary folder. trackio reads TRACKIO_DIR once, when first imported."""
    path = tmp_path_factory.mktemp("trackio")
    previous = os.environ.get("TRACKIO_DIR")
    os.environ["TRACKIO_DIR"] = str(path)
    trackio_utils = pytest.importorskip("trackio.utils")
    if Path(trackio_utils.TRACKIO_DIR) != path:
        pytest.fail(f"trackio was imported before this fixture; its store is {trackio_utils.TRACKIO_DIR}")
    yield path
    if previous is None:
        os.environ.pop("TRACKIO_DIR", None)
    else:
        os.environ["TRACKIO_DIR"] = previous
