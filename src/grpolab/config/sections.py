"""The sections of a run config that say what is trained on what: model, data, rollout, env, reward (optim, train,
eval, log: run_sections.py; algo: algo_section.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

CHECKPOINT_ABOVE_TOKENS = 8192
"""model.gradient_checkpointing=auto turns checkpointing on past this many tokens per sequence, on any device.
Qwen2.5-0.5B keeps ~1 GB of fp32 activations per layer for one 8K-token sequence (24 GB over its 24 layers,
more than the model, its gradients and AdamW's states together); checkpointed, one hidden state per layer
(0.7 GB in all). Below it, on a CPU, the third more compute is not worth the memory."""

@dataclass(frozen=True)
class LoraConfig:
    enabled: bool = False
    """Train a LoRA adapter (PEFT) instead of all weights; the reference is then the base model."""
    r: int = 16
    """LoRA rank."""
    alpha: int = 32
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the LoRA branch."""
    target_modules: str | tuple[str, ...] = "all-linear"
    """Module names to adapt, or "all-linear"; () with target_parameters alone."""
    target_parameters: tuple[str, ...] = ()
    """Parameters to adapt beside the modules (peft's target_parameters, >= 0.17: a Mixture-of-Experts' stacked
    expert weights, e.g. mlp.experts.down_proj, which no Linear holds); rollout.engine=hf only (grpolab hands
    vLLM module adapters), not with train.parallel=fsdp."""


@dataclass(frozen=True)
class ModelConfig:
    name_or_path: str = ""
    """Policy model: a local folder or a Hugging Face hub id (AutoModelForCausalLM)."""
    tokenizer: str | None = None
    """Tokenizer path or id; defaults to name_or_path."""
    revision: str | None = None
    """Hub revision (branch, tag or commit)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Dtype the trainable weights are kept in. float32 master weights with bf16 autocast is the safe default."""
    autocast: Literal["auto", "bf16", "none"] = "auto"
    """bf16 autocast for forward passes: auto = on for CUDA with bf16 and for CPUs with bf16 matrix units."""
    lm_head_fp32: bool = False
    """ScaleRL's fp32 LM head (TRL's cast_lm_head_to_fp32): the output head's weight is stored in float32 (a tied
    input embedding's with it, its output cast back to model.dtype) and the log-probs' and entropies' GEMMs run
    in float32 outside autocast, for the policy and the reference; a vLLM engine keeps its own dtype."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to run: auto picks cuda when available."""
    trust_remote_code: bool = False
    """Passed to from_pretrained."""
    attn_implementation: str | None = None
    """transformers' attention kernel for the policy, its reference and PPO's critic: null = transformers'
    default (sdpa where the model has it), eager, sdpa, flash_attention_2 / flash_attention_3 (CUDA, the
    flash-attn package; padding-free micro-batches then run as varlen), flex_attention, or a kernels-hub
    id ("kernels-community/flash-attn"; the kernels package). The vLLM engine picks its own."""
    gradient_checkpointing: bool | Literal["auto"] = "auto"
    """Trade compute for memory in the training forward (generation keeps its KV cache). auto = on with
    CUDA, where activations, not compute, bound the batch (as in TRL's and verl's GPU recipes), and on any
    device when a training sequence can be longer than CHECKPOINT_ABOVE_TOKENS (8,192: data.max_prompt_length
    + rollout.max_completion_length); off on a CPU for shorter ones, where memory is plentiful and the
    recomputed forward costs about a third more time."""
    compile: bool = False
    """torch.compile (inductor, dynamic shapes) each decoder layer of the policy and of its reference copy, for
    the training and reference forwards: fuses the elementwise work around the products (norms, rotary, the
    gated MLP's activation, casts): x1.16 per step on the 33.6M bench model on a Xeon with AMX (reference x1.36,
    training x1.22; docs/speed.md), ~x1.1 on SmolLM2-135M, for compiling in the first step that grows with the
    depth (75 s for 8 layers, 7 min for SmolLM2's 30 on 2 CPU cores): for long runs. The sampler runs uncompiled. TRL's torch_compile. Not with train.parallel=fsdp or train.sequence_parallel > 1."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA settings."""

    def checkpointing_on(self, device_type: str, longest_sequence: int = 0) -> bool:
        """gradient_checkpointing resolved for a model on ``device_type`` trained on sequences of up to
        ``longest_sequence`` tokens ("auto": on CUDA, or past CHECKPOINT_ABOVE_TOKENS)."""
        if self.gradient_checkpointing == "auto":
            return device_type == "cuda" or longest_sequence > CHECKPOINT_ABOVE_TOKENS
        return bool(self.gradient_checkpointing)


@dataclass(frozen=True)
class DataConfig:
    source: Literal["jsonl", "hf", "reasoning_gym", "arithmetic", "multiplication"] = "jsonl"
    """Where examples come from: a local file (jsonl), a Hugging Face dataset (hf), a reasoning-gym task, or a
    built-in task (arithmetic: addition; multiplication: a*b=, the agent demo's calculator task). Either of
    the first two reads a local .jsonl, .json, .parquet, .csv or .arrow file by its suffix (.jsonl natively,
    the others through datasets' builders)."""
    path: str = ""
    """A local data file, or a Hugging Face dataset id / local dataset folder (hf)."""
    name: str | None = None
    """Dataset config name (hf) or reasoning-gym dataset name."""
    split: str = "train"
    """Dataset split for training (hf)."""
    prompt_field: str = "prompt"
    """Row field holding the question."""
    answer_field: str | None = "answer"
    """Row field holding the reference answer. A row without it is fine unless a reward needs the answer
    (exact_match, math_accuracy, sft): that reward then stops naming itself and this field."""
    template: str = "none"
    """Prompt template: a key of grpolab.config.templates.TEMPLATES ("none", "r1", "r1_think") or a string containing {prompt}."""
    system_prompt: str | None = None
    """System prompt, used with the chat template or prepended to the template."""
    chat_template: bool = False
    """Wrap the templated prompt with the tokenizer's chat template."""
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments the chat template renders the prompts and an environment's messages with (TRL's
    chat_template_kwargs), e.g. {enable_thinking: false} for Qwen3's; {} = the template's defaults."""
    size: int = 1000
    """Number of generated examples (reasoning_gym, arithmetic)."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """Task parameters (reasoning_gym dataset kwargs, arithmetic options)."""
    eval_size: int = 0
    """Hold out this many examples (fixed, never drawn for training) for evaluation."""
    max_prompt_length: int = 1024
    """Prompts longer than this many tokens are an error naming the row."""
    shuffle: bool = True
    """Reshuffle the training examples every epoch (seeded)."""


@dataclass(frozen=True)
class RolloutConfig:
    engine: Literal["hf", "vllm"] = "hf"
    """Generation engine (rollout/engines.py): hf = grpolab's own decoder over the live policy; vllm = a
    vLLM engine per process, its weights synced after every update (pip install 'grpolab[vllm]')."""
    num_generations: int = 8
    """G, completions sampled per prompt (DeepSeekMath: 64; DeepSeek-R1-Zero: 16)."""
    max_completion_length: int = 256
    """Generation stops here if no EOS came first (finish_reason "length")."""
    temperature: float = 1.0
    """Sampling temperature; the trainer scores log-probs at the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1.0 = off)."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""
    min_p: float = 0.0
    """Min-p sampling: tokens below min_p x the most likely token's probability are not drawn (0.0 = off; TRL's
    min_p). Like top_p and top_k it shapes only the draw: log-probs stay those of softmax(logits / T)."""
    repetition_penalty: float = 1.0
    """Each token already in the prompt or the completion has its logit divided by this (multiplied when
    negative) before the temperature, as transformers and vLLM (1.0 = off; TRL's repetition_penalty). It shapes
    only the draw, as top_p: log-probs stay those of softmax(logits / T)."""
    max_batch_sequences: int | None = None
    """Decode at most this many sequences at once (bounds generation memory); null = as many as
    kv_cache_budget_mb allows (KV cache of prompt + completion, and the step's logits, per sequence)."""
    kv_cache_budget_mb: float | None = None
    """Memory for the sampler's KV cache and step logits when max_batch_sequences is null; null = a quarter
    of the memory free when sampling starts (CUDA: free device memory; CPU: MemAvailable)."""
    max_logprob_gap: float | None = 0.1
    """The run stops when the mean |log pi_train - log pi_sampler| per token
    (sampling/sampling_logp_difference/mean) is above this on 2 steps in a row: the engine is then not
    sampling from the policy being trained (a weight sync that misses a layer). Measured in healthy runs:
    ~0.003 (hf), ~0.01-0.02 (vllm in bf16). A step whose batch was sampled with older weights
    (rollout.max_staleness > 0) is not judged: its gap holds the updates since. null = never stop."""
    mode: Literal["colocated", "server"] = "colocated"
    """colocated = the engine runs in the training process (rollout.engine); server = a vLLM OpenAI server in
    its own process (docs/server_mode.md), the trainer its client, the weights sent by version after every
    update. Server mode needs rollout.engine=vllm (its vllm.* settings start the server)."""
    server_url: str = ""
    """server mode: the URL of a running server (``grpolab serve``), e.g. http://127.0.0.1:8000; empty =
    grpolab starts one itself, bound to 127.0.0.1, and stops it at the end of the run."""
    server_port: int = 0
    """The port of a server grpolab starts (train or serve); 0 = a free port chosen at start."""
    server_host: str = "127.0.0.1"
    """The address ``grpolab serve`` binds. Anything but loopback needs rollout.allow_remote=true and an API
    key in the variable rollout.api_key_env: the RL endpoints of vLLM's dev mode let whoever reaches them
    run engine methods (/collective_rpc)."""
    allow_remote: bool = False
    """Allow a server on, or a server_url to, a non-loopback address (with an API key, rollout.api_key_env)."""
    api_key_env: str = "GRPOLAB_VLLM_API_KEY"
    """The environment variable that holds the server's API key (never the config file, which is saved with
    the run); required with rollout.allow_remote, optional on loopback."""
    max_staleness: int = 0
    """server mode: the generation for the next k steps runs while the current step trains, so a sample may
    come from weights up to k updates old (0 = synchronous: every sample from the current weights). The engine's
    log-probs are the old log-probs; set algo.rollout_correction=tis (or mis) to correct for the lag."""
    sync_timeout_s: float = 120.0
    """server mode: the longest any one server call (a completion request, a weight update, a version check)
    may take as a whole, however its bytes trickle in, before the run stops with one error line; on the
    batch route, the longest wait for each prompt's samples. At most 86400 (a day); raise it for long
    completions on a slow engine."""
    server_start_timeout_s: float = 600.0
    """server mode: how long a server grpolab starts may take to answer /health."""
    weight_transport: Literal["auto", "shm", "nccl"] = "auto"
    """server mode: how weights reach the server. shm = buckets in shared memory files (/dev/shm), for a
    server on the same machine (CPU or GPU); nccl = vLLM's NCCL engine (GPUs; no CPU test runs it), for a
    server on GPUs of its own named by server_url (the trainer's LoRA adapters need shm); auto = shm for a server
    this run starts or a loopback server_url, nccl for a server_url elsewhere (and for grpolab serve bound
    beyond loopback)."""
    sync_bucket_mb: float = 256.0
    """server mode: the weights are sent in buckets of at most this many MB (one tensor larger than it is
    a bucket of its own)."""


@dataclass(frozen=True)
class EnvConfig:
    """Multi-turn episodes (docs/multiturn.md): the model acts, the environment answers."""

    name: str | None = None
    """An environment (grpolab.envs.ENVIRONMENTS: calculator, python, gym_retry, openenv) or
    "package.module:attribute" returning one; null = one completion per prompt."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Passed to the environment's factory (e.g. call_format, system_prompt, base_url)."""
    max_turns: int = 4
    """Model turns per episode; an episode not done by then is truncated (finish_reason "length")."""
    max_episode_tokens: int = 1024
    """Tokens after the prompt, model and environment together; each model turn is at most
    rollout.max_completion_length of them."""
    tool_timeout_s: float = 10.0
    """A tool call is cut off here; the model reads an error instead."""
    step_timeout_s: float = 300.0
    """The most an environment's step may take; past it the episode fails (env_timeout) and is run again or its
    group dropped (docs/training.md, "Failed samples"). A step that blocks its event loop (a sync hang,
    time.sleep in an async def) fails every episode still running in that loop. Tool calls inside a step
    are cut at tool_timeout_s."""
    max_retries: int = 1
    """How often an episode whose environment raised (make, reset, step: a remote service gone), broke the
    contract or timed out is run again from a fresh environment; when they are spent its group is dropped
    from the step, never scored 0 (docs/training.md, "Failed samples"). 0 = no retry."""
    max_tool_output_chars: int = 2000
    """A tool's output is cut to this many characters before it is tokenized."""
    on_tool_error: Literal["message", "end"] = "message"
    """A tool that raises, hangs or overflows: "message" = the model reads the error and goes on;
    "end" = the episode ends with reward 0."""


@dataclass(frozen=True)
class RewardSpec:
    name: str = ""
    """A registry key of grpolab.rewards.REWARDS, or "package.module:function"."""
    weight: float = 1.0
    """Weight in the total reward."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Arguments for the reward factory."""
    kind: Literal["auto", "native", "trl"] = "auto"
    """For "package.module:function": trl = a TRL reward fn(completions, **kwargs) -> list, called with
    prompts, completion_ids and every dataset column as keyword lists; native = fn(completion, example);
    auto = trl when the function names completions, prompts or completion_ids."""
    alias: str | None = None
    """Name this reward is logged and combined under (rewards/<alias>/mean); needed when two entries
    would otherwise share a name, e.g. the same reward with two kwargs. null = the reward's own name."""


@dataclass(frozen=True)
class ProcessRewardSpec:
    """A process reward (algo.supervision=process): one value per reasoning step of a completion."""

    name: str = ""
    """A key of grpolab.rewards.step_rewards.PROCESS_REWARDS ("reward_model": a neural model scoring each step
    prefix), or "package.module:function" for a rule fn(steps: list[str], example) -> list[float]."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Arguments for the process reward factory (or bound into the rule function)."""
    delimiter: str = "\n"
    """Text that ends a step. Step ends are found in the completion's token ids (the delimiter's token ids,
    or, for a one-token delimiter, any token whose text contains it), never by re-tokenizing text."""


@dataclass(frozen=True)
class RewardConfig:
    functions: tuple[RewardSpec, ...] = ()
    """Rewards summed with their weights; each component is logged as rewards/<name>/mean."""
    timeout_s: float = 60.0
    """Per-call time limit for a reward on one batch (server mode: on the groups scored together as they
    finish, docs/server_mode.md)."""
    dry_run_examples: int = 4
    """Examples each reward is tried on before training starts (0 = skip)."""
    max_retries: int = 1
    """How often a reward call that failed during training (it raised, timed out, or returned NaN or nothing
    usable) is made again, on each group of the failed call alone; a group whose calls all fail is dropped
    from the step, never scored 0 (docs/training.md, "Failed samples"). 0 = no retry: every group of the
    failed call is dropped."""
    process: ProcessRewardSpec | None = None
    """The step-level reward used when algo.supervision=process; null otherwise."""
    gold: tuple[RewardSpec, ...] = ()
    """Gold rewards: scored on every sampled completion after reward.functions and logged as
    train/gold/<name> (eval: eval/gold/<name>), but never in the advantages. With them (or measure_kl) the
    mean KL from the reference, nats per sequence, is logged as train/kl_seq, also at algo.beta = 0."""
    measure_kl: bool = False
    """Log train/kl_seq without gold rewards; at algo.beta = 0 a reference is then loaded to measure it."""
