"""vLLM engine limits and failures: a max_model_len that cannot hold a prompt and a whole completion is refused
before any model loads; a dead engine is one EngineDied line; LoRA on a tied LM head runs on an untied engine
whose log-probs match the trainer's (one engine start, module-scoped)."""

from __future__ import annotations

import types

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'grpolab[vllm]'; make test installs it)")

from grpolab.config import ConfigError, config_from_dict  # noqa: E402
from grpolab.rollout.base import EngineDied  # noqa: E402
from grpolab.rollout.vllm.engine import VLLMSampler, engine_alive, start_engine  # noqa: E402
from grpolab.rollout.vllm.setup import (  # noqa: E402
    check_max_model_len,
    check_vllm,
    engine_kwargs,
    lora_on_tied_head,
)
from grpolab.runtime.engine_spec import engine_spec  # noqa: E402


def _spec(model="m", **vllm):
    return engine_spec(config_from_dict({
        "model": {"name_or_path": str(model), "autocast": "none"},
        "rollout": {"engine": "vllm", "num_generations": 2, "max_completion_length": 8},
        "data": {"max_prompt_length": 32},
        "vllm": {"dtype": "float32", "kv_cache_space_gb": 0.0625, **vllm},
    }))  # fmt: skip


@pytest.mark.parametrize("length", [39, 20])  # below prompt + completion (32 + 8), below the prompt
def test_a_max_model_len_that_cuts_completions_is_refused(length):
    with pytest.raises(ConfigError, match=rf"vllm.max_model_len={length} is below data.max_prompt_length=32 \+ "
                                          r"rollout.max_completion_length=8 = 40: completions would be cut"):
        check_max_model_len(_spec(max_model_len=length))
    check_max_model_len(_spec(max_model_len=40))
    check_max_model_len(_spec())  # null: derived


def test_with_an_environment_the_episode_counts():
    cfg = config_from_dict({
        "model": {"name_or_path": "m"}, "vllm": {"max_model_len": 100}, "data": {"max_prompt_length": 32},
        "rollout": {"engine": "vllm", "max_completion_length": 8}, "env": {"name": "calculator", "max_episode_tokens": 64},
    })  # fmt: skip
    with pytest.raises(ConfigError, match=r"\+ env.max_episode_tokens=64 \+ .* = 104"):
        check_max_model_len(engine_spec(cfg))


def test_the_kv_block_size_reaches_the_engine_and_a_bad_one_is_one_line(tiny_model_dir):
    """vLLM's CPU default (128) caches no block of a shorter prompt: each of its G samples computes it again."""
    assert engine_kwargs(_spec(block_size=32), device_type="cpu", autocast_dtype=None)["block_size"] == 32
    assert "block_size" not in engine_kwargs(_spec(), device_type="cpu", autocast_dtype=None)  # vLLM's default
    with pytest.raises(ConfigError, match="vllm.block_size=48: vLLM's CPU attention needs a multiple of 32"):
        check_vllm(_spec(tiny_model_dir, block_size=48), device_type="cpu")
    with pytest.raises(ConfigError, match="vllm.block_size must be a multiple of 16"):
        _spec(block_size=20)


class _Engine:
    """What VLLMSampler reads of an engine, and a generate that fails as vLLM's does."""

    def __init__(self, max_model_len=64, error=None):
        self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=max_model_len, dtype=None))
        self.error = error

    def generate(self, *args, **kwargs):
        raise self.error


def test_a_prompt_the_engine_cannot_hold_is_refused_before_generating():
    sampler = VLLMSampler(_Engine(max_model_len=12), types.SimpleNamespace(pad_token_id=0), max_completion_length=8,
                          eos_token_ids=[1])  # fmt: skip
    with pytest.raises(ConfigError, match=r"vllm.max_model_len=12 cannot hold a prompt of 5 tokens and max_completion"):
        sampler.sample([[2] * 5], num_generations=1)


def test_engine_dead_error_is_one_engine_died_line():
    from vllm.v1.engine.exceptions import EngineDeadError

    sampler = VLLMSampler(_Engine(error=EngineDeadError()), types.SimpleNamespace(pad_token_id=0),
                          max_completion_length=4, eos_token_ids=[1])  # fmt: skip
    with pytest.raises(EngineDied, match=r"the vLLM engine died during sampling \(EngineDeadError: "):
        sampler.sample([[2, 3]], num_generations=1)
    with pytest.raises(KeyError), engine_alive("x"):  # anything else passes through
        raise KeyError("k")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from grpolab.tasks.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("vllm_tied"), hidden_size=64, num_layers=2, num_heads=2)


def _lora(model_dir, targets):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    peft = get_peft_model(policy, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # B starts at zero: make the adapter act
    return peft


def test_lora_on_a_tied_head_is_detected(model_dir):
    assert lora_on_tied_head(_lora(model_dir, ["q_proj", "lm_head"]))
    assert not lora_on_tied_head(_lora(model_dir, ["q_proj"]))
    kwargs = engine_kwargs(_spec(model_dir), device_type="cpu", autocast_dtype=None, untie_head=True)
    assert kwargs["hf_overrides"] == {"tie_word_embeddings": False} and kwargs["load_format"] == "dummy"


def test_the_head_s_update_reaches_the_engine(model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    peft = _lora(model_dir, ["q_proj", "lm_head"])
    engine = start_engine(**engine_kwargs(_spec(model_dir), device_type="cpu", autocast_dtype=None, untie_head=True))
    sampler = VLLMSampler(engine, tok, max_completion_length=6, eos_token_ids=[tok.eos_token_id], weights_from=peft)
    prompts = [tok.encode("1+2="), tok.encode("ab")]
    out = sampler.sample(prompts, num_generations=2, generator=torch.Generator().manual_seed(0))
    for i in range(out.num_sequences):
        n = int(out.lengths[i])
        prompt, completion = out.prompt_ids[i], out.completion_ids[i, :n].tolist()
        with torch.no_grad():
            logits = peft(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)
        torch.testing.assert_close(out.logprobs[i, :n], expected, atol=1e-4, rtol=0)  # measured ~1e-6


class _Hangs(_Engine):
    """Steps forever in Python, as vLLM's in-process engine loop would if it never finished."""

    def generate(self, *args, **kwargs):
        import time

        end = time.monotonic() + 20
        while time.monotonic() < end:
            time.sleep(0.01)


def test_a_hung_engine_is_cut_at_vllm_timeout_s():
    import time

    sampler = VLLMSampler(_Hangs(), types.SimpleNamespace(pad_token_id=0), max_completion_length=4,
                          eos_token_ids=[1], timeout_s=0.3)  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(EngineDied, match=r"did not finish sampling within vllm.timeout_s=0.3 s"):
        sampler.sample([[2, 3]], num_generations=1)
    assert time.monotonic() - t0 < 3
