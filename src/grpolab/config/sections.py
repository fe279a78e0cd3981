"""The sections of a run config: model, data, rollout, env, reward, optim, train, eval, log (algo: algo_section.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

TrackerName = Literal["tensorboard", "wandb", "trackio"]

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


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-6
    """Peak learning rate (DeepSeekMath: 1e-6 for 7B; tiny models need ~1e-4)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip (0 = off)."""
    warmup_steps: int = 0
    """Linear warm-up, in optimizer steps."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule after warm-up."""
    min_lr_ratio: float = 0.0
    """cosine only: the floor the rate decays to, as a fraction of optim.lr (transformers' cosine_with_min_lr
    min_lr_rate; 0 = decay to 0)."""


AUTO_MICRO_BATCH = {"cpu": 64, "cuda": 8}
"""train.micro_batch_size=auto by device type."""


@dataclass(frozen=True)
class TrainConfig:
    num_steps: int = 100
    """Training steps; one step = one generation batch."""
    prompts_per_step: int = 8
    """P, prompts per generation batch (completions per step = P * G)."""
    micro_batch_size: int | Literal["auto"] = "auto"
    """Sequences per forward/backward (gradient accumulation over a minibatch). auto = 64 on a CPU, 8 on
    CUDA, where 64 rows of long completions do not fit beside the model (bound the tokens too with
    max_tokens_per_micro_batch)."""
    max_bad_steps: int = 3
    """Stop (TrainingError, last good checkpoint kept) after this many steps in a row whose update was
    skipped for a NaN or infinite loss or gradient; 0 = never stop, only skip."""
    max_no_signal_steps: int = 50
    """Stop (TrainingError) after this many steps in a row that carry no learning signal: every group's
    rewards equal (zero std) or no valid reward at all. A warning comes after 3 such steps; 0 = never stop."""
    max_failed_group_share: float = 0.5
    """Stop (TrainingError, one line naming each kind of failure and the first one's message) when more than
    this share of a step's groups (all ranks, all of DAPO's rounds) were dropped for a failed sample: an
    engine error, an environment or sandbox that crashed or hung, a reward that raised, timed out or returned
    NaN or nothing, after their retries (docs/training.md, "Failed samples"). The step trains on the groups
    left. 0 = stop at the first dropped group; 1 = never stop for the share (a step left with no group on
    some rank still stops). NeMo-RL's max_generation_failures, as a share."""
    parallel: Literal["auto", "none", "ddp", "fsdp"] = "auto"
    """Under torchrun: "ddp" (each rank holds the model; gradients all-reduced), "fsdp" (FSDP2: parameters,
    gradients and optimizer state sharded; DCP checkpoints), "auto" (ddp when WORLD_SIZE > 1, else none).
    "none" is the single process; grpolab.distributed.parallel."""
    max_tokens_per_micro_batch: int | None = None
    """Also bound each forward by padded tokens, rows x (longest prompt + longest completion): rows are
    sorted by length and packed up to this budget (a longer row runs alone); null = micro_batch_size only.
    Activation memory follows tokens, so this keeps long completions from running out of memory."""
    padding_free: bool = False
    """Pack each training micro-batch's rows into one padding-free sequence (position ids restart per row;
    transformers masks across rows; flash-attention takes it as varlen): no compute or activation memory
    on pad tokens. The same log-probs and gradients as the padded forward (grpolab.training.packing)."""
    offload_activations: bool = False
    """Keep the activations the backward needs in host memory (torch.autograd.graph.save_on_cpu), copied back
    as the backward reaches them: for the longest sequences, after checkpointing (which leaves one hidden
    state per layer) and sequence parallelism. Costs a host round trip per saved tensor; a no-op on a CPU."""
    sequence_parallel: int = 1
    """DeepSpeed-Ulysses sequence parallelism under torchrun: each group of this many consecutive ranks holds
    the same rows and splits every training sequence's positions between them (1/N each); attention trades
    heads for positions with an all-to-all before and after. WORLD_SIZE = data-parallel size x N; the model's
    attention heads must divide by N. For completions whose activations outgrow one device
    (grpolab.distributed.sequence, docs/distributed.md, "Long sequences"). 1 = off."""
    deterministic: bool = False
    """Deterministic kernels: torch.use_deterministic_algorithms (an op with no deterministic version stops
    the run, naming it), cuBLAS's fixed workspace (CUBLAS_WORKSPACE_CONFIG), cuDNN without autotuning,
    flash-attention's deterministic backward. On CUDA a run and its --resume then give the same numbers, as
    do two runs of one seed on one GPU kind; some kernels run slower. A CPU run is reproducible without it.
    TRL's full_determinism."""
    dist_timeout_s: float = 600.0
    """Under torchrun: how long a collective waits for the other ranks before the job fails (the process
    group's timeout). Raise it when one rank's work between collectives (a long rollout, a slow reward,
    a checkpoint on a slow disk) can take longer."""
    dist_bind_device: bool = True
    """Under torchrun on CUDA: give the process group its device (``device_id`` = cuda:LOCAL_RANK), so NCCL
    makes its communicator at start-up and each collective knows its GPU. false = let NCCL find it lazily."""

    def micro_batch_rows(self, device_type: str) -> int:
        """micro_batch_size resolved for ``device_type`` ("auto": 64 on a CPU, 8 on CUDA)."""
        if self.micro_batch_size == "auto":
            return AUTO_MICRO_BATCH.get(device_type, AUTO_MICRO_BATCH["cpu"])
        return int(self.micro_batch_size)


@dataclass(frozen=True)
class EvalConfig:
    every: int = 0
    """Evaluate on the held-out set every N steps (0 = only when asked)."""
    num_samples: int = 16
    """n samples per eval prompt for Pass@K / Maj@K."""
    temperature: float = 1.0
    """Sampling temperature for evaluation (DeepSeekMath fig. 7: 0.7)."""
    max_prompts: int = 0
    """Evaluate on at most this many held-out prompts (0 = all)."""
    greedy: bool = True
    """Also report greedy accuracy."""
    checkpoints: tuple[str, ...] = ()
    """Model folders (or hub ids) that ``grpolab eval`` compares; empty = model.name_or_path."""
    ks: tuple[int, ...] = ()
    """K values for Pass@K / Maj@K; empty = 1, 2, 4, ... up to num_samples."""
    correct_threshold: float = 0.5
    """A sample counts as correct when its total reward is above this."""
    blind_grader: str | None = None
    """A second grading of every sample that ignores format: a reward name as in reward.functions, e.g.
    answer_anywhere (the reference answer anywhere in the reply). Its Pass@K / Maj@K are reported beside the
    rewards', with the share of format errors (wrong by the rewards and right by it, or no answer extracted).
    null = none."""
    prompts_per_batch: int = 32
    """Eval prompts sampled together (each with num_samples completions)."""
    output_dir: str = ""
    """Where eval JSON and plots go; empty = <log.output_dir>/<log.run_name>/eval."""


@dataclass(frozen=True)
class LogConfig:
    output_dir: str = "runs"
    """Parent folder of run directories."""
    run_name: str = "run"
    """Run directory name: output_dir/run_name; a plain folder name (no "/", not "." or "..")."""
    checkpoint_every: int = 50
    """Save a checkpoint every N steps (and at the end); 0 = only at the end."""
    keep_last: int = 2
    """Checkpoints kept on disk."""
    samples_every: int = 1
    """Write samples.jsonl, and the trackers' completions table, every N steps (0 = never)."""
    tensorboard: bool = True
    """Also write TensorBoard events."""
    progress: bool = True
    """Show progress: a bar on a terminal, else a log line every ~10 s or tenth of the work (grpolab.progress)."""
    overwrite: bool = False
    """Let a fresh run (no --resume) start in a run directory that holds checkpoints, deleting them;
    without it that is an error, so that no saved run is lost by mistake."""
    report_to: tuple[TrackerName, ...] | None = None
    """Experiment trackers: any of tensorboard, wandb, trackio (pip install 'grpolab[wandb]' or
    '[trackio]'). They get the resolved config, every metric, and a completions table every
    log.samples_every steps; a resumed run continues the same tracker run. null = [tensorboard] if
    log.tensorboard else []; when set, it replaces log.tensorboard."""
    project: str = "grpolab"
    """Tracker project (wandb, trackio); the tracker run is named log.run_name."""
    resume_allow: tuple[str, ...] = ()
    """Config keys (or sections, e.g. "model") that --resume may change although they alter what was
    trained; same as ``grpolab train --resume --resume-allow-change KEY``. See runtime/resume.py."""

    def __post_init__(self) -> None:
        if self.report_to is not None and len(set(self.report_to)) != len(self.report_to):
            raise ValueError(f"log.report_to lists a tracker twice: {list(self.report_to)}; name each once")
        # the run directory is output_dir/run_name, and log.overwrite deletes in it: "", "." or ".." (or a
        # path) would make it output_dir itself, or a folder beside it, and other runs' checkpoints with it
        if self.run_name.strip() in ("", ".", "..") or "/" in self.run_name or "\\" in self.run_name:
            raise ValueError(
                f"log.run_name={self.run_name!r} is not a folder name: the run directory is log.output_dir/log.run_name; "
                "give a plain name (no '/', not '.' or '..'), and put the parent folder in log.output_dir"
            )

    @property
    def trackers(self) -> tuple[str, ...]:
        """log.report_to, or the trackers log.tensorboard implies when it is null."""
        if self.report_to is not None:
            return tuple(self.report_to)
        return ("tensorboard",) if self.tensorboard else ()
