"""Model sources a careless or hostile user gives: a ``package:`` path that leaves the package, a cut or
damaged ``.gguf``, a cache that cannot be written or holds a broken folder, a model folder with broken
files. Each is one ``ModelSourceError`` / ``ModelLoadError`` line, never a traceback or a file outside
the package read."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="the GGUF path needs the gguf package: pip install 'grpolab[real]'")

from gguf_files import write_tiny_gguf  # noqa: E402

from grpolab.config import ModelConfig  # noqa: E402
from grpolab.errors import GrpolabError  # noqa: E402
from grpolab.models import sources as model_sources  # noqa: E402
from grpolab.models.loading import ModelLoadError, load_policy  # noqa: E402
from grpolab.models.sources import ModelSourceError, import_gguf, local_source  # noqa: E402


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path)
    return path


@pytest.fixture(scope="module")
def plain_folder(tiny_gguf, tmp_path_factory) -> Path:
    return import_gguf(tiny_gguf, tmp_path_factory.mktemp("plain") / "model")


@pytest.fixture
def fake_package(tmp_path, monkeypatch) -> Path:
    package = tmp_path / "site" / "fake_escape_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (tmp_path / "secret.gguf").write_bytes(b"GGUF outside the package")
    monkeypatch.syspath_prepend(str(package.parent))
    return package


@pytest.mark.parametrize("inner", ["../../secret.gguf", "sub/../../../secret.gguf", "/etc/passwd"])
def test_a_package_path_that_leaves_the_package_is_refused(fake_package, inner):
    with pytest.raises(ModelSourceError, match=r"leaves the package folder; name a file inside the package"):
        model_sources.gguf_path(f"package:fake_escape_pkg/{inner}")


def test_a_link_inside_the_package_pointing_out_of_it_is_not_followed(fake_package, tmp_path):
    (fake_package / "m.gguf").symlink_to(tmp_path / "secret.gguf")
    with pytest.raises(ModelSourceError, match=r"package 'fake_escape_pkg' has no file 'm.gguf'"):
        model_sources.gguf_path("package:fake_escape_pkg/m.gguf")


@pytest.mark.parametrize("keep", [10, 200, 0.5, -8])
def test_a_truncated_gguf_is_one_error(tiny_gguf, tmp_path, keep):
    data = tiny_gguf.read_bytes()
    n = int(len(data) * keep) if isinstance(keep, float) else keep % len(data)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:n])
    with pytest.raises(ModelSourceError, match=rf"could not read {cut} as a GGUF model \(truncated or damaged\?\)"):
        import_gguf(cut, tmp_path / "out")
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == [cut]  # no half-written folder


def test_an_unwritable_cache_is_one_error(tiny_gguf, tmp_path, monkeypatch):
    blocker = tmp_path / "cache_is_a_file"
    blocker.write_text("")
    monkeypatch.setenv("GRPOLAB_CACHE", str(blocker))
    with pytest.raises(ModelSourceError, match=r"cannot create the output folder .*GRPOLAB_CACHE"):
        local_source(str(tiny_gguf))


def test_an_unreadable_gguf_is_one_error(tmp_path):
    folder = tmp_path / "dir.gguf"
    folder.mkdir()
    with pytest.raises(ModelSourceError, match=r"does not exist \(or is not a file\)"):
        model_sources.check_gguf_file(folder)


def test_a_broken_cached_folder_is_named_not_loaded(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("GRPOLAB_CACHE", str(tmp_path / "cache"))
    folder = Path(local_source(str(tiny_gguf)))
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(ModelSourceError, match=rf"the converted folder {folder} .* is incomplete .*delete it"):
        local_source(str(tiny_gguf))


def _cut_weights(d: Path) -> None:
    weights = d / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_cut_weights, r"could not load a causal LM from .*deserializing header"),
        (lambda d: (d / "config.json").write_text("[]"), r"could not load the tokenizer from"),
        (lambda d: (d / "adapter_config.json").write_text("{"), r"adapter_config.json cannot be read as a PEFT"),
        (lambda d: (d / "adapter_config.json").write_text("{}"), r"names no base_model_name_or_path"),
    ],
    ids=["cut-weights", "config-not-an-object", "adapter-config-not-json", "adapter-config-no-base"],
)
def test_a_broken_model_folder_is_one_error(plain_folder, tmp_path, mutate, message):
    folder = tmp_path / "model"
    shutil.copytree(plain_folder, folder)
    mutate(folder)
    with pytest.raises(ModelLoadError, match=message) as info:
        load_policy(ModelConfig(name_or_path=str(folder), device="cpu"))
    assert isinstance(info.value, GrpolabError)


def test_a_name_too_long_to_look_up_is_one_error():
    from grpolab.models.hub import HubUnavailable, hub_load_kwargs
    from grpolab.runtime.preflight import check_model_source

    with pytest.raises(ModelLoadError, match=r"cannot be looked up \(File name too long\)"):
        check_model_source(ModelConfig(name_or_path="x" * 5000, device="cpu"))
    with pytest.raises(HubUnavailable, match=r"model.name_or_path 'x+\.\.\.' cannot be looked up"):
        hub_load_kwargs("x" * 5000, None, "model.name_or_path")
