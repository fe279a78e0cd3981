"""Fail fast on a hub id that cannot be fetched: offline (HF_HUB_OFFLINE=1) or with the Hub unreachable, a
model that is not in the local cache is one line at once, instead of transformers' retries (about a
minute) ending in a traceback. A cached model loads from the cache without touching the network."""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from grpolab.errors import GrpolabError

_TRUE = {"1", "true", "yes", "on"}


class HubUnavailable(GrpolabError, RuntimeError):
    """A hub id that is neither cached nor reachable; the message says how to get it."""


def offline_mode() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").lower() in _TRUE


@functools.cache
def hub_reachable(timeout_s: float = 3.0) -> bool:
    """One TCP connection to the Hub's endpoint (HF_ENDPOINT), once per process."""
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def _cached(repo_id: str, revision: str | None) -> bool:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        snapshot_download(repo_id, revision=revision, local_files_only=True)
    except (LocalEntryNotFoundError, ValueError, OSError):
        return False
    return True


def hub_load_kwargs(source: str, revision: str | None, key: str) -> dict[str, bool]:
    """``{"local_files_only": True}`` when the Hub cannot be reached but ``source`` is cached, ``{}`` when it
    can (or ``source`` is a local folder); HubUnavailable naming ``key`` when neither."""
    if Path(source).expanduser().exists():
        return {}
    offline = offline_mode()
    if not offline and hub_reachable():
        return {}
    if _cached(source, revision):
        return {"local_files_only": True}
    why = "HF_HUB_OFFLINE=1" if offline else "the Hugging Face Hub is unreachable from this machine"
    raise HubUnavailable(
        f"{key} '{source}' is not a local folder and not in the Hugging Face cache, and {why}: give a local "
        f"folder, or download it where the Hub is reachable (hf download {source})"
    )
