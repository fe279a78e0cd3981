"""The launch checks of grpolab.distributed.parallel: which parallel modes a config may ask for."""

from __future__ import annotations

import pytest

from grpolab.config import ConfigError
from grpolab.distributed.parallel import resolve_parallel


def test_parallel_modes():
    assert resolve_parallel("auto", 1) == "none"
    assert resolve_parallel("auto", 4) == "ddp"
    assert resolve_parallel("ddp", 4) == "ddp"
    with pytest.raises(ConfigError, match="train.parallel=none under 2 processes"):
        resolve_parallel("none", 2)
    with pytest.raises(ConfigError, match="train.parallel=fsdp needs a process group"):
        resolve_parallel("fsdp", 1)
