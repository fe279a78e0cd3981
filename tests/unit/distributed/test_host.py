"""grpolab.distributed.host: a training step hands glibc's freed heap back before its biggest allocations."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from grpolab.distributed import host

# With glibc's thresholds where its dynamic rule settles in a torch process (set in the environment, so
# that the run does not depend on what was freed before), 2 MiB tensors come from the heap; free 96 MiB
# of them, each between small live ones (the heap cannot shrink by itself): prints the MiB of RSS given back by the
# free alone and then by give_back_freed_memory.
CODE = """
import torch
from grpolab.distributed.host import give_back_freed_memory
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
blocks, keep = [], []
for _ in range(48):  # each 2 MiB block between small live ones: freeing it leaves a hole, not a free top
    blocks.append(torch.ones(2**19))
    keep.append(torch.ones(16))
start = rss_mb()
del blocks
freed = rss_mb()
assert give_back_freed_memory()
print(start - freed, start - rss_mb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim: Linux only")
def test_freed_heap_memory_leaves_the_resident_memory():
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    by_free, by_trim = (float(x) for x in proc.stdout.split()[-2:])
    assert by_trim > 80 and by_trim > by_free + 40  # of the 96 MiB freed: the trim, not the free, returns it


def test_each_backward_gives_memory_back_before_the_embedding_gradient_and_only_inside(monkeypatch):
    calls = []
    monkeypatch.setattr(host, "_glibc", lambda: object())  # any C library: the hook is what is tested
    monkeypatch.setattr(host, "give_back_freed_memory", lambda: calls.append(len(calls)) or True)
    monkeypatch.setattr(host, "FRESH_MAPPING_BYTES", 84)  # the 7 x 3 fp32 gradient counts as a fresh mapping here
    emb = torch.nn.Embedding(7, 3)
    head = torch.nn.Linear(3, 2)
    ids = torch.tensor([[1, 2, 5]])

    def grad():
        emb.zero_grad()
        head(emb(ids)).sum().backward()
        return emb.weight.grad.clone()

    want = grad()
    with host.freed_memory_given_back_before(emb):
        got = [grad(), grad()]
        with torch.no_grad():
            emb(ids)  # no graph, no hook
    assert calls == [0, 1]  # once per backward
    grad()
    assert calls == [0, 1]  # the hook is gone after the block
    for g in got:
        torch.testing.assert_close(g, want, rtol=0, atol=0)  # the gradient passes unchanged


def test_a_gradient_that_the_heap_serves_gets_no_trim(monkeypatch):
    calls = []
    monkeypatch.setattr(host, "_glibc", lambda: object())
    monkeypatch.setattr(host, "give_back_freed_memory", lambda: calls.append(1) or True)
    emb = torch.nn.Embedding(7, 3)  # 84 bytes of gradient, far under glibc's largest mmap threshold (32 MiB)
    with host.freed_memory_given_back_before(emb):
        emb(torch.tensor([[1, 2]])).sum().backward()
    assert calls == []


def test_only_the_step_that_allocates_the_optimizer_states_is_trimmed(monkeypatch):
    calls = []
    monkeypatch.setattr(host, "give_back_freed_memory", lambda: calls.append(1) or True)
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([p], lr=0.1)
    p.grad = torch.ones(3)
    assert host.give_back_before_first_step(opt) and calls == [1]  # no state yet: AdamW allocates it next
    opt.step()
    assert not host.give_back_before_first_step(opt) and calls == [1]  # the states exist: nothing big follows
    assert host.give_back_before_first_step(object()) and calls == [1, 1]  # no state to read: as before


def test_the_step_decorator_finds_the_input_embeddings(monkeypatch):
    seen = []
    monkeypatch.setattr(host, "freed_memory_given_back_before", lambda m: seen.append(m) or _null())
    model = torch.nn.Module()
    model.get_input_embeddings = lambda: "embeddings"
    assert host.giving_back_freed_memory(lambda m, x: x + 1)(model, 1) == 2
    assert seen == ["embeddings"]


def _null():
    import contextlib

    return contextlib.nullcontext()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim: Linux only")
def test_too_little_free_heap_is_not_trimmed():
    assert host.give_back_freed_memory(min_free=1 << 50) is False  # the next micro-batch would fault it back


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim: Linux only")
def test_a_step_on_an_accelerator_installs_no_hooks_and_trims_nothing(monkeypatch):
    """The meta device stands in for CUDA: the step's tensors are not glibc's there."""
    seen, trims = [], []
    monkeypatch.setattr(host, "freed_memory_given_back_before", lambda m: seen.append(m) or _null())

    def step(model):
        trims.append(host.give_back_freed_memory(min_free=0))
        return "done"

    for device, want_hooks, want_trim in (("meta", [], False), ("cpu", ["embeddings"], True)):
        seen.clear(), trims.clear()
        model = torch.nn.Linear(2, 2, device=device)
        model.get_input_embeddings = lambda: "embeddings"
        assert host.giving_back_freed_memory(step)(model) == "done"
        assert seen == want_hooks and trims == [want_trim], device
    assert host.give_back_freed_memory(min_free=0)  # outside a step: as before
