"""The vLLM sampler against grpolab's own decoder and the trainer's log-probs, on one shared engine.

One engine for the whole module (its start-up costs seconds): a tiny fp32 Qwen2 saved to a temporary
folder (head size 32: vLLM's CPU attention has no kernel for the 16 of the default tiny model).
A second engine (``chunked_engine``) runs bf16 with chunked prefills.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'grpolab[vllm]'; make test installs it)")

from grpolab.config import ConfigError, config_from_dict  # noqa: E402
from grpolab.rollout.base import Sampler  # noqa: E402
from grpolab.rollout.hf import HFSampler  # noqa: E402
from grpolab.rollout.vllm.engine import VLLMSampler, shutdown_engines, start_engine  # noqa: E402
from grpolab.rollout.vllm.setup import check_vllm, engine_kwargs  # noqa: E402
from grpolab.rollout.vllm.sync import policy_weights  # noqa: E402
from grpolab.runtime.engine_spec import engine_spec  # noqa: E402
from grpolab.training.logprobs import completion_logprobs  # noqa: E402

G = 4
MAX_NEW = 10


def run_spec(path, **vllm):
    """The engine spec of a run of the tiny model in ``path`` with these vllm.* settings."""
    cfg = config_from_dict(
        {
            "model": {"name_or_path": str(path), "autocast": "none"},
            "rollout": {"engine": "vllm", "num_generations": G, "max_completion_length": MAX_NEW},
            "data": {"max_prompt_length": 32},
            "vllm": {"dtype": "float32", "kv_cache_space_gb": 0.0625, **vllm},
        }
    )
    return engine_spec(cfg)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from grpolab.tasks.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("vllm_tiny"), hidden_size=64, num_layers=2, num_heads=2)


@pytest.fixture(scope="module")
def tok(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture
def policy(model_dir):
    """A fresh fp32 copy of the saved weights for each test (tests change them)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(model_dir):
    llm = start_engine(**engine_kwargs(run_spec(model_dir), device_type="cpu", autocast_dtype=None))
    yield llm
    shutdown_engines()


@pytest.fixture(scope="module")
def chunked_engine(model_dir):
    """A second engine, bf16 as a CPU run's under autocast, whose steps hold 16 tokens: a longer prompt's
    prefill is split over steps and the token sampled after a partial chunk is discarded, which crashed
    vLLM 0.32 on CPU for a request with a seed of its own ("CPU Generator does not use offset")."""
    kwargs = engine_kwargs(run_spec(model_dir, dtype="bfloat16"), device_type="cpu", autocast_dtype=None, colocated=True)
    assert kwargs["load_format"] == "dummy"  # the sync before the first sample sends every weight
    lines = _VLLMLines()
    logging.getLogger("vllm").addHandler(lines)
    try:
        llm = start_engine(**kwargs, max_num_batched_tokens=CHUNK)
    finally:
        logging.getLogger("vllm").removeHandler(lines)
    llm.start_lines = lines.lines  # what vLLM said while it started, for the test of the fp32 checkpoint
    return llm


class _VLLMLines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


CHUNK = 16


@pytest.fixture
def prompts(tok):
    return [tok.encode("1+2="), tok.encode("12*34=5+6"), tok.encode("a")]


def make(engine, tok, policy, *, temperature=1.0, eos=None, **kw):
    """A sampler that takes ``policy``'s weights before its first sample (as after a resume)."""
    eos = eos or [tok.eos_token_id]
    return VLLMSampler(
        engine, tok, max_completion_length=MAX_NEW, temperature=temperature, eos_token_ids=eos, weights_from=policy, **kw
    )


def trainer_logprobs(policy, tok, out, temperature: float) -> torch.Tensor:
    with torch.no_grad():
        lp, _ = completion_logprobs(
            policy, out.prompt_ids, out.completion_ids, out.completion_mask, pad_id=tok.pad_token_id, temperature=temperature
        )
    return lp


def assert_engine_matches_trainer(policy, tok, out, temperature: float) -> None:
    expected = trainer_logprobs(policy, tok, out, temperature)
    mask = out.completion_mask
    # fp32 on both sides, different kernels: agreement to ~1e-6 nats; 1e-4 leaves room, a stale weight
    # is off by whole nats
    torch.testing.assert_close(out.logprobs[mask], expected[mask], atol=1e-4, rtol=0)


def test_is_a_sampler(engine, tok, policy):
    assert isinstance(make(engine, tok, policy), Sampler)


def test_greedy_equals_hf_token_for_token(engine, tok, policy, prompts):
    # a second EOS id the model emits, so some rows stop early and others run to the limit
    first = HFSampler(policy, tok, max_completion_length=MAX_NEW, temperature=0).sample(prompts, num_generations=1)
    eos = [tok.eos_token_id, int(first.completion_ids[1, 2])]
    hf = HFSampler(policy, tok, max_completion_length=MAX_NEW, temperature=0, eos_token_ids=eos)
    want = hf.sample(prompts, num_generations=G)
    got = make(engine, tok, policy, temperature=0, eos=eos).sample(prompts, num_generations=G)
    assert torch.equal(got.completion_ids, want.completion_ids)
    assert torch.equal(got.completion_mask, want.completion_mask)
    assert got.finish_reasons == want.finish_reasons and set(got.finish_reasons) == {"stop", "length"}
    assert got.texts == want.texts and got.prompt_ids == want.prompt_ids
    torch.testing.assert_close(got.logprobs, want.logprobs, atol=1e-4, rtol=0)  # temperature 1 when greedy


def test_greedy_with_a_repetition_penalty_equals_hf_token_for_token(engine, tok, policy, prompts):
    # both penalise the prompt's tokens and the sampled ones (never the hf batch's left padding)
    hf = HFSampler(policy, tok, max_completion_length=MAX_NEW, temperature=0, repetition_penalty=1.8)
    want = hf.sample(prompts, num_generations=1)
    got = make(engine, tok, policy, temperature=0, repetition_penalty=1.8).sample(prompts, num_generations=1)
    assert torch.equal(got.completion_ids, want.completion_ids)
    plain = HFSampler(policy, tok, max_completion_length=MAX_NEW, temperature=0).sample(prompts, num_generations=1)
    assert not torch.equal(want.completion_ids, plain.completion_ids)


def test_sampled_logprobs_are_the_trainers_and_rows_are_prompt_major(engine, tok, policy, prompts):
    eos = [tok.eos_token_id, *tok.convert_tokens_to_ids(list("0123"))]  # ~5/70 per step: some rows stop
    out = make(engine, tok, policy, temperature=0.7, eos=eos).sample(
        prompts, num_generations=G, generator=torch.Generator().manual_seed(0)
    )
    assert out.completion_ids.shape[0] == len(prompts) * G and out.num_generations == G
    assert out.prompt_ids == [p for p in prompts for _ in range(G)]
    assert_engine_matches_trainer(policy, tok, out, 0.7)
    for row, reason in enumerate(out.finish_reasons):
        n = int(out.lengths[row])
        last = int(out.completion_ids[row, n - 1])
        assert (reason == "stop") == (last in eos) and (reason == "stop" or n == MAX_NEW)
        assert not out.completion_mask[row, n:].any() and (out.completion_ids[row, n:] == tok.pad_token_id).all()
    assert "stop" in out.finish_reasons


def test_seed_per_step_reproducible_and_distinct(engine, tok, policy, prompts):
    sampler = make(engine, tok, policy)
    a = sampler.sample(prompts, num_generations=G, generator=torch.Generator().manual_seed(3))
    b = sampler.sample(prompts, num_generations=G, generator=torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(3)
    first, second = (sampler.sample(prompts, num_generations=G, generator=gen) for _ in range(2))
    assert torch.equal(a.completion_ids, b.completion_ids)  # same generator state, same tokens
    assert torch.equal(first.completion_ids, a.completion_ids)
    assert not torch.equal(first.completion_ids, second.completion_ids)  # the generator moved: a new step
    rows = a.completion_ids.view(len(prompts), G, -1)
    assert any(not torch.equal(rows[p, 0], rows[p, g]) for p in range(len(prompts)) for g in range(1, G))


def test_chunked_prefills_sampled_from_one_seed_per_call(chunked_engine, tok, policy):
    long = [tok.encode("12*34=5+6, 7*8=56 and 9+10=19?")[:30], tok.encode("1+2+3+4+5+6+7+8+9+10+11=")]
    assert all(len(p) > CHUNK for p in long)  # each prefill takes two or more engine steps
    sampler = make(chunked_engine, tok, policy)
    torch.manual_seed(7)
    np.random.seed(7)
    trainer_torch, trainer_np = torch.random.get_rng_state(), np.random.get_state()
    a = sampler.sample(long, num_generations=G, generator=torch.Generator().manual_seed(3))
    b = make(chunked_engine, tok, policy).sample(long, num_generations=G, generator=torch.Generator().manual_seed(3))
    c = sampler.sample(long, num_generations=G, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.completion_ids, c.completion_ids)  # another seed, other tokens
    rows = a.completion_ids.view(len(long), G, -1)
    assert all(any(not torch.equal(rows[p, 0], rows[p, g]) for g in range(1, G)) for p in range(len(long)))
    # the engine drew from forked generators: the trainer's streams are where they were
    assert torch.equal(torch.random.get_rng_state(), trainer_torch)
    assert all(np.array_equal(x, y) for x, y in zip(np.random.get_state(), trainer_np, strict=True))


def test_an_fp32_policy_is_sent_to_a_bf16_engine_in_bf16(chunked_engine, tok, policy, prompts, monkeypatch):
    """vLLM warns once per tensor of another dtype than its parameter's ("Attempted to load weight ...
    with dtype torch.float32 into parameter with dtype torch.bfloat16"): the sync casts first. What is sent
    is checked directly (vLLM's warnings may already have been shown once by an earlier test in the run)."""
    from grpolab.rollout.vllm import engine as module

    sent: dict[str, torch.dtype] = {}
    real = module.policy_weights

    def recording(model, dtype=None, **kwargs):
        for name, tensor in real(model, dtype, **kwargs):
            sent[name] = tensor.dtype
            yield name, tensor

    monkeypatch.setattr(module, "policy_weights", recording)
    lines = _VLLMLines()
    vllm_log = logging.getLogger("vllm")
    vllm_log.addHandler(lines)
    try:
        sampler = make(chunked_engine, tok, policy)
        sampler.update_weights(policy)
    finally:
        vllm_log.removeHandler(lines)
    assert next(policy.parameters()).dtype == torch.float32 and sent
    # read off the engine's model: bf16, except that on a CPU with AMX vLLM's CPU engine keeps the q/k/v biases
    # in fp32 (its fused qkv_proj's bias; seen on a Xeon with AMX, not on a Zen 4 with AVX512-BF16)
    dtypes = sampler.engine_dtypes
    engine_held = {p.dtype for p in chunked_engine.apply_model(lambda m: list(m.parameters()))[0]}
    assert dtypes.default == torch.bfloat16 and engine_held == {torch.bfloat16, *dtypes.held.values()}
    assert all(n.endswith("_proj.bias") and d == torch.float32 for n, d in dtypes.held.items()), dtypes.held
    # every tensor goes in the dtype the engine holds it in: every weight matrix in bf16
    assert sent == {n: dtypes.held.get(n, torch.bfloat16) for n, _ in policy.named_parameters(remove_duplicate=False)}
    assert {d for n, d in sent.items() if n.endswith(".weight")} == {torch.bfloat16}
    sizes = {n: p.numel() for n, p in policy.named_parameters(remove_duplicate=False)}
    assert sampler.last_sync_bytes == sum(sizes[n] * (2 if d == torch.bfloat16 else 4) for n, d in sent.items())
    assert sampler.last_sync_bytes < 0.51 * 4 * elements(policy)  # about half the fp32 engine's (the next test)
    assert [line for line in lines.lines if "Attempted to load weight" in line] == []
    # nor at the engine's start: it does not read the fp32 checkpoint into its bf16 weights (dummy load)
    assert [line for line in chunked_engine.start_lines if "Attempted to load weight" in line] == []
    # the engine started with dummy weights: only the sync makes it sample from the policy. bf16 against
    # the fp32 trainer: within rollout.max_logprob_gap (0.1 nats per token, the run's own limit; measured
    # 0.0008 here, while the dummy weights the engine started with are off by whole nats)
    out = sampler.sample(prompts, num_generations=G, generator=torch.Generator().manual_seed(0))
    mask = out.completion_mask
    gap = (out.logprobs[mask] - trainer_logprobs(policy, tok, out, 1.0)[mask]).abs().mean()
    assert gap < 0.1, gap


def elements(model) -> int:
    """The elements a sync sends: every parameter, the tied head under both names."""
    return sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))


def test_update_weights_syncs_a_changed_policy(engine, tok, policy, prompts):
    sampler = make(engine, tok, policy)
    gen_state = torch.Generator().manual_seed(5).get_state()
    before = sampler.sample(prompts, num_generations=G, generator=torch.Generator().set_state(gen_state))
    assert_engine_matches_trainer(policy, tok, before, 1.0)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    sampler.update_weights(policy)
    after = sampler.sample(prompts, num_generations=G, generator=torch.Generator().set_state(gen_state))
    assert not torch.equal(after.completion_ids, before.completion_ids)  # a changed weight changes the output
    assert_engine_matches_trainer(policy, tok, after, 1.0)
    assert 0 < sampler.last_sync_s < 10
    assert sampler.last_sync_bytes == 4 * elements(policy)  # an fp32 engine: fp32 tensors, kept


def test_first_sample_uses_the_weights_given(engine, tok, policy, prompts):
    """A new sampler on an engine holding other weights (a resumed run, the next run of a process)."""
    stale = make(engine, tok, policy)
    stale.sample(prompts, num_generations=1)
    with torch.no_grad():
        policy.model.embed_tokens.weight.mul_(1.5)
    out = make(engine, tok, policy).sample(prompts, num_generations=G, generator=torch.Generator().manual_seed(0))
    assert_engine_matches_trainer(policy, tok, out, 1.0)


def test_lora_merged_into_the_weights_sent(engine, tok, policy, prompts):
    from peft import LoraConfig, get_peft_model

    peft = get_peft_model(policy, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)  # B starts at zero: make the adapter act
    sent = dict(policy_weights(peft))
    base_names = {n for n, _ in peft.get_base_model().named_parameters(remove_duplicate=False) if "lora_" not in n}
    assert set(sent) == {n.replace(".base_layer", "") for n in base_names}
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(sent[q], peft.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight)
    out = make(engine, tok, peft).sample(prompts, num_generations=G, generator=torch.Generator().manual_seed(0))
    assert_engine_matches_trainer(peft, tok, out, 1.0)
    assert any("lora_" in n for n, _ in peft.named_parameters())  # the training model is left as it was


def test_engine_settings_from_the_config(model_dir):
    cfg = config_from_dict({"model": {"name_or_path": model_dir}, "rollout": {"engine": "vllm", "max_completion_length": 7}})
    spec = engine_spec(cfg)
    cpu = engine_kwargs(spec, device_type="cpu", autocast_dtype=torch.bfloat16)
    assert cpu["dtype"] == "bfloat16" and cpu["enforce_eager"] is True and cpu["kv_cache_memory_bytes"] == 2**30
    assert cpu["max_model_len"] == 1024 + 7 and cpu["enable_prefix_caching"] is True
    assert cpu["logprobs_mode"] == "processed_logprobs"
    cuda = engine_kwargs(spec, device_type="cuda", autocast_dtype=None)
    assert cuda["dtype"] == "float32" and cuda["enforce_eager"] is False and "kv_cache_memory_bytes" not in cuda


def test_checks_before_any_model_loads(model_dir, tmp_path, monkeypatch):
    import json
    import shutil

    from grpolab.tasks.tiny import save_tiny

    check_vllm(run_spec(model_dir), device_type="cpu")  # the module's model passes
    with pytest.raises(ConfigError, match="head size 16"):
        check_vllm(run_spec(save_tiny(tmp_path / "h16", hidden_size=64, num_layers=1, num_heads=4)), device_type="cpu")
    alien = tmp_path / "alien"
    shutil.copytree(model_dir, alien)
    config = json.loads((alien / "config.json").read_text())
    (alien / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchForCausalLM"]}))
    with pytest.raises(ConfigError, match="architecture"):
        check_vllm(run_spec(alien), device_type="cpu")
    with pytest.raises(ConfigError, match="kv_cache_space_gb=1e-05 GiB cannot hold one sequence"):
        check_vllm(run_spec(model_dir, kv_cache_space_gb=1e-5), device_type="cpu")
    with pytest.raises(ConfigError, match="more than this machine's free memory"):
        check_vllm(run_spec(model_dir, kv_cache_space_gb=10_000), device_type="cpu")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"pip install 'grpolab\[vllm\]'"):
        check_vllm(run_spec(model_dir), device_type="cpu")
