"""Loading the policy and building the reference model.

Any Hugging Face causal LM, by local path or hub id, or a GGUF file (``.gguf`` or
``package:<module>/<file>``), read through the plain folder it is converted to once
(grpolab.models.sources). With LoRA (PEFT) the reference model is the base
model with the adapter disabled, so no second copy is held. With beta = 0 there is no reference.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from grpolab.config import ModelConfig
from grpolab.errors import ConfigError, GrpolabError
from grpolab.models.chunked_head import install_chunked_head, keep_head_in_fp32
from grpolab.models.hub import hub_load_kwargs
from grpolab.models.inference import enable_checkpointing, inference_copy
from grpolab.models.lean_ops import install_lean_ops
from grpolab.models.sources import local_source

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(GrpolabError, RuntimeError):
    """A model or tokenizer could not be loaded; the message says which and how to fix it."""


def resolve_device(cfg: ModelConfig) -> torch.device:
    """The device of model.device; cuda without a CUDA device is a ConfigError (before any model loads)."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"model.device=cuda but torch sees no CUDA device (torch {torch.__version__}, CUDA build "
            f"{torch.version.cuda}); use model.device=auto or cpu, or run where a GPU is visible"
        )
    if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def cpu_has_bf16_matmul() -> bool:
    """True on CPUs whose bf16 matrix work is native (AVX512-BF16 or AMX): there bf16 is ~2x+ faster.

    The environment variable GRPOLAB_CPU_BF16=0 (or 1) overrides the detection: ``GRPOLAB_CPU_BF16=0``
    runs what a CPU without bf16 instructions runs (fp32 everywhere ``autocast: auto``), e.g. to test
    that path on a machine that has them."""
    forced = os.environ.get("GRPOLAB_CPU_BF16", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_autocast(cfg: ModelConfig, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for forward passes, or None for full precision."""
    if cfg.autocast == "none":
        return None
    if cfg.autocast == "bf16":
        return torch.bfloat16
    if device.type == "cuda":  # T4 / V100 only emulate bf16 (slowly), and vLLM refuses it below sm 8.0
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else None
    return torch.bfloat16 if cpu_has_bf16_matmul() else None


def use_tf32(cfg: ModelConfig, device: torch.device) -> bool:
    """On CUDA, fp32 matmuls on TF32 tensor cores (what remains fp32 under autocast, and every matmul of
    fp32 weights), in this process and in an in-process vLLM worker (which otherwise sets "highest").
    Not on a CPU (results there stay as they were), nor with model.autocast: none, which asks for full
    precision. Returns True when it switched TF32 on."""
    if device.type != "cuda" or cfg.autocast == "none":
        return False
    torch.set_float32_matmul_precision("high")
    os.environ.setdefault("VLLM_FLOAT32_MATMUL_PRECISION", "high")  # read by vLLM's GPU worker at start
    return True


def use_deterministic_kernels() -> None:
    """train.deterministic: the same numbers from every run of one seed (TRL's full_determinism, without its
    CUDA_LAUNCH_BLOCKING). Strict, as TRL's: an op with no deterministic kernel raises (the CLI says which
    in one line) rather than warn, since only then do SDPA's flash and memory-efficient backward kernels
    take their deterministic paths. Called before the first CUDA matmul, whose cuBLAS handle reads the
    workspace size."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    os.environ.setdefault("FLASH_ATTENTION_DETERMINISTIC", "1")  # read by transformers' flash-attention calls
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def autocast_context(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def load_tokenizer(cfg: ModelConfig) -> PreTrainedTokenizerBase:
    source = local_source(cfg.tokenizer or cfg.name_or_path)  # a GGUF source: its converted folder
    hub = hub_load_kwargs(source, cfg.revision, "model.tokenizer" if cfg.tokenizer else "model.name_or_path")
    try:
        tok = AutoTokenizer.from_pretrained(
            source, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code, **hub
        )
    except _UNLOADABLE as err:
        raise ModelLoadError(
            f"could not load the tokenizer from '{source}' (model.tokenizer / model.name_or_path): {err}. "
            "Give a local folder with tokenizer files or a hub id reachable from this machine."
        ) from err
    if tok.pad_token_id is None:
        if tok.eos_token_id is None:
            raise ModelLoadError(f"tokenizer '{source}' has neither a pad nor an EOS token; add one to it")
        log.warning("tokenizer '%s' has no pad token: using its EOS token for padding", source)
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_policy(
    cfg: ModelConfig, *, placement: str = "device", longest_sequence: int = 0
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The trainable policy (optionally LoRA-wrapped) and its tokenizer, on the configured device.

    ``placement`` for FSDP2 (run/parallel.materialize_from_rank0): "host" loads the weights into host
    memory (rank 0), "meta" builds the model from its config with no storage (the other ranks), so no
    GPU ever holds the unsharded model and only one process reads the files (verl does the same).
    ``longest_sequence``: the most tokens a training sequence holds (model.gradient_checkpointing=auto
    checkpoints past CHECKPOINT_ABOVE_TOKENS).
    """
    if not cfg.name_or_path:
        raise ModelLoadError("model.name_or_path is empty: set it to a local model folder or a hub id")
    source = local_source(cfg.name_or_path)  # a GGUF source: its converted folder
    tok = load_tokenizer(cfg)
    device = resolve_device(cfg)
    use_tf32(cfg, device)
    adapter_config = Path(source, "adapter_config.json")
    if adapter_config.exists():  # a LoRA checkpoint: its base model, then the adapter
        from peft import PeftModel

        base = _adapter_base(adapter_config)
        model = _from_pretrained(cfg, base).to(device)
        _install_training_ops(cfg, model)
        model = PeftModel.from_pretrained(model, source, is_trainable=cfg.lora.enabled)
    elif placement == "meta":
        model = _on_meta(cfg, source)
        _install_training_ops(cfg, model)
        if cfg.lora.enabled:  # PEFT wraps a meta model as it does a loaded one: the adapter's shapes, no values
            model = _wrap_lora(cfg, model)
    else:
        model = _from_pretrained(cfg, source).to(device if placement == "device" else torch.device("cpu"))
        _install_training_ops(cfg, model)
        if cfg.lora.enabled:
            model = _wrap_lora(cfg, model)
    if placement != "meta":  # a meta model has no values yet: rank 0 checks the ones it broadcasts
        check_finite_weights(model, cfg.name_or_path)
    if cfg.checkpointing_on(device.type, longest_sequence):
        enable_checkpointing(model)  # backward recomputes each layer with its forward's attention (inference.py)
        model.config.use_cache = False  # training forward only; the sampler passes use_cache=True itself
    if cfg.compile:
        compile_layers(model)
    return model, tok


def compile_layers(model: torch.nn.Module) -> int:
    """torch.compile each decoder layer of ``model`` in place (model.compile): transformers' layers
    (``GradientCheckpointingLayer``), each compiled with dynamic shapes, so a new sequence length reuses the
    compiled code. ``copy.deepcopy`` drops a module's compiled call: the reference compiles its copy's layers
    itself (``Reference``), the sampler's copy runs uncompiled, as the sampler runs the policy itself
    (``inference.eager_calls``). Returns the number of layers compiled."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise ModelLoadError(
            f"model.compile=true: {type(model).__name__} has no transformers decoder layers to compile; set model.compile=false"
        )
    # one compiled graph per layer and kind of forward: a forward with a KV cache (the shared prompt's) indexes the
    # cache by the layer's number, so each layer compiles its own; the reference's copy, with and without grad,
    # with and without a cache make more. torch's default (8 per code object) would leave all but 8 eager.
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, 8 * len(layers))
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 16 * len(layers))
    for layer in layers:
        layer.compile(dynamic=True)
    return len(layers)


def _install_training_ops(cfg: ModelConfig, model: PreTrainedModel) -> None:
    """The chunked LM head (model.lm_head_fp32: in fp32) and the lean RMSNorm / SwiGLU (models/lean_ops.py), before
    any wrapping (PEFT here; DDP / FSDP2 by the caller)."""
    install_lean_ops(model)
    if not install_chunked_head(model) and cfg.lm_head_fp32:
        raise ModelLoadError(
            f"model.lm_head_fp32: {cfg.name_or_path}'s output head is not a plain Linear layer, so it cannot be kept "
            "in float32; set model.lm_head_fp32=false"
        )
    if cfg.lm_head_fp32:
        keep_head_in_fp32(model)


def check_finite_weights(model: torch.nn.Module, source: str) -> None:
    """ModelLoadError naming the first parameter that holds NaN or inf: a damaged file, or one saved from a
    diverged run, is refused at load (step 0) instead of failing in the sampler. One host sync."""
    params = list(model.named_parameters())
    flags = torch.stack([torch.isfinite(p.detach()).all().to(params[0][1].device) for _, p in params])
    if bool(flags.all()):
        return
    name = next(n for (n, _), ok in zip(params, flags.tolist(), strict=True) if not ok)
    raise ModelLoadError(
        f"model '{source}' (model.name_or_path): its weight '{name}' holds NaN or infinite values, so it cannot "
        "sample; the file is damaged or was saved from a diverged run: use an earlier checkpoint or download it again"
    )


def _adapter_base(adapter_config: Path) -> str:
    """The base model a LoRA checkpoint's adapter_config.json names; one line on a broken file."""
    try:
        base = json.loads(adapter_config.read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError) as err:
        raise ModelLoadError(f"{adapter_config} cannot be read as a PEFT adapter config: {err}") from err
    if not isinstance(base, str) or not base:
        raise ModelLoadError(f"{adapter_config} names no base_model_name_or_path; add the base model's folder or id")
    return base


_UNLOADABLE = (OSError, ValueError, TypeError, KeyError)
"""What from_pretrained raises on a broken folder (a config.json that is not an object: TypeError)."""


def _on_meta(cfg: ModelConfig, source: str) -> PreTrainedModel:
    """The model of ``source``'s config on the meta device: shapes and dtypes, no storage, no file read."""
    from transformers import AutoConfig

    hub = hub_load_kwargs(source, cfg.revision, "model.name_or_path")
    try:
        config = AutoConfig.from_pretrained(source, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code, **hub)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(
                config, dtype=_DTYPES[cfg.dtype], trust_remote_code=cfg.trust_remote_code, **attention_kwargs(cfg)
            )
    except _UNLOADABLE as err:  # the same line rank 0's load gives (an attention kernel refused, a broken config)
        raise ModelLoadError(f"could not build a causal LM from '{source}' (model.name_or_path): {err}") from err


def attention_kwargs(cfg: ModelConfig) -> dict[str, str]:
    """``attn_implementation`` for from_pretrained / from_config when model.attn_implementation is set."""
    return {"attn_implementation": cfg.attn_implementation} if cfg.attn_implementation else {}


def _from_pretrained(cfg: ModelConfig, source: str) -> PreTrainedModel:
    hub = hub_load_kwargs(source, cfg.revision, "model.name_or_path")
    try:
        return AutoModelForCausalLM.from_pretrained(
            source,
            revision=cfg.revision,
            dtype=_DTYPES[cfg.dtype],
            trust_remote_code=cfg.trust_remote_code,
            **attention_kwargs(cfg),
            **hub,
        )
    except (*_UNLOADABLE, SafetensorError) as err:  # SafetensorError: a truncated weights file
        raise ModelLoadError(
            f"could not load a causal LM from '{source}' (model.name_or_path): {err}. "
            "Check the path exists and holds config.json and weights, or that the hub id is reachable."
        ) from err


def _wrap_lora(cfg: ModelConfig, model: PreTrainedModel) -> PreTrainedModel:
    from peft import LoraConfig, get_peft_model

    target = cfg.lora.target_modules
    lora = LoraConfig(
        r=cfg.lora.r,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=target if isinstance(target, str) else list(target),
        target_parameters=list(cfg.lora.target_parameters) or None,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


def is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


class Reference:
    """The frozen reference policy pi_ref, as a context that yields a model to run forward with.

    Full fine-tuning: a frozen deep copy of the policy at the start (or last reset). With
    ``compute_dtype`` (the autocast dtype) its Linear weights are stored in that dtype: under autocast
    it computes the same log-probs as the full-precision copy (autocast rounds each weight the same
    way), in half the memory and without re-casting the weights at every forward.
    LoRA: the policy itself with the adapter disabled; no second copy.
    """

    def __init__(self, policy: PreTrainedModel, compute_dtype: torch.dtype | None = None):
        self._policy = policy
        self.frozen_model: PreTrainedModel | None = (
            None if is_peft(policy) else inference_copy(policy, compute_dtype)
        )
        """The frozen copy (full fine-tuning), or None under LoRA."""
        if self.frozen_model is not None and any(m._compiled_call_impl is not None for m in policy.modules()):
            compile_layers(self.frozen_model)  # model.compile: the copy's layers as the policy's

    @contextlib.contextmanager
    def model(self) -> Iterator[PreTrainedModel]:
        if self.frozen_model is not None:
            yield self.frozen_model
        else:
            with self._policy.disable_adapter():
                yield self._policy

    def reset_to(self, policy: PreTrainedModel, alpha: float = 1.0) -> None:
        """pi_ref <- alpha * pi_theta + (1 - alpha) * pi_ref: alpha 1 is DeepSeekMath's reset (Algorithm 1;
        DeepSeek-R1 every 400 steps), alpha < 1 TR-DPO's soft update (arXiv 2404.09656, TRL's sync_ref_model)."""
        if is_peft(policy):
            raise NotImplementedError(
                "resetting the reference under LoRA needs merging the adapter; use algo.ref_reset_every=0 with LoRA"
            )
        if alpha == 1.0:
            self.frozen_model.load_state_dict(policy.state_dict())
            return
        theta, mixed = policy.state_dict(), set()
        with torch.no_grad():
            for name, ref in self.frozen_model.state_dict().items():
                if ref.is_floating_point() and ref.data_ptr() not in mixed:  # tied weights are one tensor: mixed once
                    mixed.add(ref.data_ptr())
                    ref.lerp_(theta[name].to(device=ref.device, dtype=ref.dtype), alpha)


def count_parameters(model: torch.nn.Module, *, trainable_only: bool = False) -> int:
    ps: Callable[[torch.nn.Parameter], bool] = (
        (lambda p: p.requires_grad) if trainable_only else (lambda p: True)
    )
    return sum(p.numel() for p in model.parameters() if ps(p))
