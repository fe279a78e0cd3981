"""sys/peak_mem_*: on CUDA each phase's own peak (the allocator's statistics reset before it), allocated
and reserved; on a CPU the process's peak RSS as before. CUDA's counters are stood in for here."""

from __future__ import annotations

import pytest
import torch

from grpolab.runtime.logging import PhaseMemory, memory_before_models_mb


class FakeAllocator:
    """torch.cuda's peak counters: ``use`` raises the current figures, a reset brings the peaks down to them."""

    def __init__(self):
        self.allocated = self.reserved = 0
        self.peak_allocated = self.peak_reserved = 0
        self.resets = 0

    def use(self, allocated_mb: int, reserved_mb: int) -> None:
        self.allocated, self.reserved = allocated_mb << 20, reserved_mb << 20
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def reset(self, device=None) -> None:
        self.resets += 1
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved


@pytest.fixture
def fake_cuda(monkeypatch):
    alloc = FakeAllocator()
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", alloc.reset)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: alloc.peak_allocated)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: alloc.peak_reserved)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: alloc.allocated)
    return alloc


def test_each_phase_reports_its_own_peak_on_cuda(fake_cuda):
    memory = PhaseMemory(torch.device("cuda"))
    fake_cuda.use(9000, 12000)  # model loading: a lifetime peak the step must not report
    fake_cuda.use(1000, 12000)
    with memory.phase("rollout"):
        fake_cuda.use(3000, 12000)
        fake_cuda.use(1000, 12000)
    with memory.phase("train"):
        fake_cuda.use(5000, 14000)
    m = memory.metrics()
    assert fake_cuda.resets == 2
    assert m == {
        "sys/peak_mem_mb": 5000.0, "sys/peak_reserved_mb": 14000.0,
        "sys/peak_mem_rollout_mb": 3000.0, "sys/peak_reserved_rollout_mb": 12000.0,
        "sys/peak_mem_train_mb": 5000.0, "sys/peak_reserved_train_mb": 14000.0,
    }  # fmt: skip
    with memory.phase("train"):  # the next step starts from the current figures, not the old peaks
        fake_cuda.use(2000, 14000)
    assert memory.metrics()["sys/peak_mem_train_mb"] == 5000.0  # still allocated at the reset
    fake_cuda.use(100, 14000)
    with memory.phase("train"):
        fake_cuda.use(200, 14000)
    assert memory.metrics()["sys/peak_mem_train_mb"] == 200.0


def test_on_a_cpu_the_peak_is_the_process_rss_and_nothing_is_reset(fake_cuda):
    memory = PhaseMemory(torch.device("cpu"))
    with memory.phase("train"):
        pass
    m = memory.metrics()
    assert list(m) == ["sys/peak_mem_mb"] and m["sys/peak_mem_mb"] > 10 and fake_cuda.resets == 0


def test_the_baseline_before_the_models_is_what_is_allocated_then_not_an_earlier_peak(fake_cuda):
    """run_info's baseline_mem_mb: a second run in one process (an API user's loop) starts after the first
    one's peak; on CUDA its baseline is what is allocated when it starts."""
    fake_cuda.use(9000, 12000)  # an earlier run in this process
    fake_cuda.use(300, 12000)
    assert memory_before_models_mb(torch.device("cuda")) == 300.0
    assert memory_before_models_mb(torch.device("cpu")) > 10  # a CPU's: the peak RSS, as before
