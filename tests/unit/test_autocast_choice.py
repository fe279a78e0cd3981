"""model.autocast: "auto" follows the CPU's bf16 support, which GRPOLAB_CPU_BF16 can override."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpolab.config import ModelConfig
from grpolab.models.loading import cpu_has_bf16_matmul, resolve_autocast

CPU = torch.device("cpu")


@pytest.mark.parametrize("forced, want", [("0", None), ("1", torch.bfloat16)])
def test_the_environment_override_decides_auto_on_a_cpu(monkeypatch, forced, want):
    monkeypatch.setenv("GRPOLAB_CPU_BF16", forced)
    assert cpu_has_bf16_matmul() is (forced == "1")
    assert resolve_autocast(ModelConfig(name_or_path="m", autocast="auto"), CPU) is want
    # explicit choices are not the detection's business
    assert resolve_autocast(ModelConfig(name_or_path="m", autocast="bf16"), CPU) is torch.bfloat16
    assert resolve_autocast(ModelConfig(name_or_path="m", autocast="none"), CPU) is None


def test_without_the_override_auto_reads_the_cpu_flags(monkeypatch):
    monkeypatch.delenv("GRPOLAB_CPU_BF16", raising=False)
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        pytest.skip("no /proc/cpuinfo on this system")
    assert cpu_has_bf16_matmul() is ("avx512_bf16" in flags or "amx_bf16" in flags)
