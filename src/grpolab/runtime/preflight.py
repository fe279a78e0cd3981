"""Checks run by ``train()`` before any compute is spent, each failing with a message that says how to fix it.

In the order train() meets them: the run directory (resume or not), the model path, the rewards,
then (once the tokenizer and model config are loaded) the context length.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

from grpolab.config import Config, ConfigError, ModelConfig
from grpolab.config.checks import check_attention_runtime
from grpolab.data import DataError
from grpolab.models.hub import hub_load_kwargs
from grpolab.models.loading import ModelLoadError, resolve_device
from grpolab.models.sources import check_source, is_converted_source
from grpolab.runtime import checkpoint as ckpt
from grpolab.runtime.resume import ResumePoint, resume_point

log = logging.getLogger(__name__)


def prepare_run_dir(cfg: Config, *, resume: bool) -> ResumePoint | None:
    """The checkpoint to resume from (checked, see runtime/resume.py), or None; call it holding the run dir's lock.

    Partial checkpoints left by a kill are deleted (never resumable). A fresh run (no --resume) in a run
    directory that already holds checkpoints is an error, unless log.overwrite: starting over would mix
    two runs' checkpoints, and --resume would then pick the wrong one. Even then nothing is deleted
    here: ``clear_previous_run`` does that once every check that can fail has passed.
    """
    run_dir = cfg.run_dir
    for partial in ckpt.remove_partial(run_dir):
        log.warning("removed %s, a checkpoint whose writing was interrupted", partial)
    if resume:
        return resume_point(cfg)
    found = ckpt.list_checkpoints(run_dir)
    if found and not cfg.log.overwrite:
        raise ConfigError(
            f"log.run_name: {run_dir} already holds checkpoints (up to {found[-1][1].name}). Pass --resume "
            "to continue that run, choose another log.run_name, or set log.overwrite=true to start over "
            "(its checkpoints are then deleted)."
        )
    return None


def clear_previous_run(cfg: Config) -> None:
    """log.overwrite=true on a fresh run: delete the previous run's checkpoints (after every check passed)."""
    root = ckpt.checkpoint_root(cfg.run_dir)
    if cfg.log.overwrite and ckpt.list_checkpoints(cfg.run_dir):
        log.warning("log.overwrite=true: deleting the checkpoints of the previous run in %s", cfg.run_dir)
        shutil.rmtree(root)
    Path(cfg.run_dir, "resumes.jsonl").unlink(missing_ok=True)


def check_model_source(cfg: ModelConfig) -> None:
    """A local model path that does not exist fails here, before the data and rewards are loaded.

    An absolute path, or one starting with ``.`` or ``~``, is local; anything else that is not an
    existing folder is taken for a hub id, which must be cached or the Hub reachable (grpolab.models.hub). A
    ``.gguf`` file or a ``package:<module>/<file>`` source is checked to exist, to be GGUF, and to be
    readable (the gguf package installed); its conversion waits for the model load.
    """
    device = resolve_device(cfg)  # model.device=cuda without CUDA
    check_attention_runtime(cfg, device.type)  # flash attention without CUDA or its package
    source = cfg.name_or_path
    if not source:
        raise ModelLoadError("model.name_or_path is empty: set it to a local model folder or a hub id")
    if is_converted_source(source):
        check_source(source)
        return
    path = Path(source).expanduser()
    try:
        path.is_dir()  # a name the OS refuses to look up (too long): one line, not an OSError
    except OSError as err:
        raise ModelLoadError(
            f"model.name_or_path: {source[:80]}... cannot be looked up ({err.strerror}); give a model folder or a hub id"
        ) from err
    if source.startswith(("/", ".", "~")) and not path.exists():
        raise ModelLoadError(
            f"model.name_or_path: {source} does not exist. Give the folder that holds config.json and the "
            "weights (e.g. one written by save_pretrained), or a hub id such as Qwen/Qwen2.5-0.5B"
        )
    if path.is_dir() and not (path / "config.json").exists() and not (path / "adapter_config.json").exists():
        raise ModelLoadError(
            f"model.name_or_path: {source} is a folder without config.json (or adapter_config.json); "
            "point it at the model folder itself"
        )
    if path.is_dir():
        _check_model_files(path, source)
    hub_load_kwargs(source, cfg.revision, "model.name_or_path")  # a hub id: cached or reachable, else one line
    if not cfg.trust_remote_code:
        _check_custom_code(source, path / "config.json" if path.is_dir() else _cached_config(source, cfg.revision))


def _cached_config(repo_id: str, revision: str | None) -> Path | None:
    """A hub model's config.json when it is in the local cache (nothing is downloaded here)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    return Path(found) if isinstance(found, str) else None


def _check_custom_code(source: str, config_json: Path | None) -> None:
    """A model whose config.json maps AutoModelForCausalLM to code of its own (``auto_map``) loads only with
    model.trust_remote_code, as TRL's trust_remote_code: one line here rather than transformers' paragraph
    at load. A model_type that transformers implements itself loads without that code, as transformers does."""
    from transformers import CONFIG_MAPPING

    try:
        config = json.loads(config_json.read_text()) if config_json is not None and config_json.is_file() else {}
    except (OSError, ValueError):
        return  # a broken config.json is the loader's to report
    code = (config.get("auto_map") or {}).get("AutoModelForCausalLM") if isinstance(config, dict) else None
    if code and config.get("model_type") not in CONFIG_MAPPING:
        raise ConfigError(
            f"model '{source}' (model.name_or_path) contains custom code ({code}, config.json's auto_map) that "
            "transformers runs to build it: set model.trust_remote_code=true (TRL: trust_remote_code=True) if "
            "you trust that code"
        )


def _check_model_files(path: Path, source: str) -> None:
    """A sharded (torchrun) checkpoint, or a model whose index names a shard that is not there."""
    if (path / "sharded.json").exists():
        raise ModelLoadError(
            f"model.name_or_path: {source} is a sharded (torchrun) checkpoint, not a model folder: export it "
            f"first (grpolab export {source} <folder>), or resume its run with grpolab train --resume"
        )
    for index in path.glob("*.safetensors.index.json"):
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise ModelLoadError(f"model.name_or_path: {index} is unreadable ({err}); the model folder is damaged") from err
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise ModelLoadError(
                f"model.name_or_path: {path / missing[0]}, listed in {index.name}, is missing"
                f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}: the folder was copied or "
                "exported only in part; copy or export it again"
            )


def check_context(cfg: Config, prompt_ids: Sequence[Sequence[int]], model_config) -> None:
    """Longest prompt + rollout.max_completion_length (with an environment: + env.max_episode_tokens, the
    episode's budget) against the model's max_position_embeddings.

    Beyond it, a model with learned position embeddings (GPT-2) fails with an index error, so that is
    an error here; a rotary model (Llama, Qwen) runs but was not trained there, so that is a warning.
    """
    limit = getattr(model_config, "max_position_embeddings", None)
    if not prompt_ids or not isinstance(limit, int):
        return
    longest = max(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    prompt_len = len(prompt_ids[longest])
    key, budget = (
        ("env.max_episode_tokens", cfg.env.max_episode_tokens)
        if cfg.env.name is not None
        else ("rollout.max_completion_length", cfg.rollout.max_completion_length)
    )
    total = prompt_len + budget
    if total <= limit:
        return
    room = limit - budget  # what the completions leave for a prompt
    if prompt_len >= limit:
        advice = (
            f"The prompt alone fills the context: set data.max_prompt_length to {limit - 1} or less to find "
            f"the long prompts, and lower {key}"
        )
    elif room < 1:
        advice = (
            f"{key} alone fills the context: lower it to {limit - prompt_len} or less "
            "(the prompts need room too)"
        )
    else:
        advice = (
            f"Lower {key} to {limit - prompt_len} or less, or set "
            f"data.max_prompt_length to {room} or less to find the long prompts"
        )
    message = (
        f"the longest prompt (example {longest}, {prompt_len} tokens) + {key}="
        f"{budget} = {total} tokens, beyond the model's max_position_embeddings="
        f"{limit}. {advice}"
    )
    rotary = getattr(model_config, "rope_parameters", None) or getattr(model_config, "rope_theta", None)
    if rotary is None:
        raise DataError(message + " (this model's learned position embeddings stop there)")
    log.warning("%s (a rotary model runs past it, but was not trained there)", message)
