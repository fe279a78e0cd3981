"""The process's vLLM engines: vLLM imported as grpolab needs it, each engine started once for its settings and
reused by the next sampler with the same settings (an evaluation, the next run of a sweep, a test module), freed
by ``shutdown_engines``; and the state per engine that the samplers sharing it keep (rollout/vllm/engine.py).

An engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``); its construction leaves the trainer's
random states and ``torch.set_num_threads`` as they were.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import time
from typing import Any

import torch

log = logging.getLogger(__name__)


def import_vllm():
    """The vllm package, set up before its first import: engines in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), its INFO lines off unless ``VLLM_LOGGING_LEVEL`` is set, and
    the weight reload's false alarm about rotary embeddings dropped (``RotaryReloadNoise``)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    import vllm

    reload_log = logging.getLogger(RELOAD_LOGGER)
    if not any(isinstance(f, RotaryReloadNoise) for f in reload_log.filters):
        reload_log.addFilter(RotaryReloadNoise())
    return vllm


RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class RotaryReloadNoise(logging.Filter):
    """Drops vLLM 0.32's "RotaryEmbedding: Failed to load weights", logged at every weight sync (150 times
    in a 150-step demo run). The reload counts the rotary layer's cos/sin cache, a non-persistent buffer
    that no checkpoint holds, as a weight to load, and then puts the cache back as it was: nothing failed
    (the synced engine's log-probs equal the trainer's). The same warning for any other layer still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        layer = record.args[0] if isinstance(record.args, tuple) and record.args else ""
        return not (record.msg == "%s: Failed to load weights" and str(layer).endswith("RotaryEmbedding"))


_ENGINES: dict[str, Any] = {}
"""The engines this process started, by their settings (``engine_kwargs``)."""
ENGINE_STATE: dict[int, dict[str, Any]] = {}
"""By engine (id): the model its weights were last synced from, and whether a level-2 sleep discarded
them since. Per engine, not per sampler: an evaluation's sampler shares the run's engine."""
IDLE_AWAKE: dict[int, bool] = {}
"""By idle engine (id): True while the sampling rank's engine is awake (after a ``take_part``, until a sleep)."""


def start_engine(**kwargs):
    """The process's vLLM ``LLM`` with these settings: started once, then reused.

    vLLM is imported by ``import_vllm`` (engines in this process, its INFO lines off). vLLM
    seeds python / numpy / torch and replaces ``torch.set_num_threads`` while it starts; both are restored,
    so the trainer's random streams (saved in checkpoints) and its thread count are its own.
    """
    key = json.dumps(kwargs, sort_keys=True, default=str)
    if key not in _ENGINES:
        LLM = import_vllm().LLM  # noqa: N806 - vLLM's name

        t0 = time.perf_counter()
        with _trainer_state_kept():
            _ENGINES[key] = LLM(**kwargs)
        log.info("vllm: engine started in %.1f s (%s)", time.perf_counter() - t0, kwargs.get("model"))
    return _ENGINES[key]


def shutdown_engines() -> None:
    """Free every engine this process started."""
    import gc

    while _ENGINES:
        _, engine = _ENGINES.popitem()
        ENGINE_STATE.pop(id(engine), None)
        IDLE_AWAKE.pop(id(engine), None)
        with contextlib.suppress(AttributeError):
            engine.llm_engine.engine_core.shutdown()
        del engine
    gc.collect()


@contextlib.contextmanager
def _trainer_state_kept():
    import numpy as np

    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if torch.cuda.is_available() else []):
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)
            torch.set_num_threads = set_num_threads
            torch.set_num_threads(threads)
