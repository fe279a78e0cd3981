"""Multi-turn episodes sampled by vLLM: the same token-in / token-out layout as with hf, the engine's
log-probs equal the trainer's on the model's tokens, and a GRPO run with an environment on the engine.

One engine for the module (its start-up costs seconds): the unit checks build it from the training run's
own settings, so the run finds it in the process's engine cache. The tiny fp32 Qwen2 has head size 32
(vLLM's CPU attention has no kernel for 16) and a chat template; its generation_config adds the digits
as stop tokens, so a random model ends its turns and episodes reach a second turn.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'grpolab[vllm]'; make test installs it)")

from grpolab.commands.train import train  # noqa: E402
from grpolab.config import load_config  # noqa: E402
from grpolab.envs import EnvStep  # noqa: E402
from grpolab.rollout.base import Sampler
from grpolab.rollout.multiturn import MultiTurnSampler, episode_prompt_ids  # noqa: E402
from grpolab.rollout.vllm.engine import VLLMSampler, shutdown_engines, start_engine  # noqa: E402
from grpolab.rollout.vllm.setup import engine_kwargs  # noqa: E402
from grpolab.runtime.engine_spec import engine_spec  # noqa: E402
from grpolab.runtime.logging import read_metrics  # noqa: E402
from grpolab.training.logprobs import completion_logprobs  # noqa: E402
from grpolab.types import Example  # noqa: E402

MAX_NEW = 8
STOPS = "0123456789"


class TwoTurns:
    """The model answers, the tool says "12", the model answers again; each turn scores its digit share."""

    tools: list = []

    def __init__(self) -> None:
        self.turns = 0

    def reset(self, example):
        return [{"role": "user", "content": example.prompt}]

    def step(self, model_turn: str) -> EnvStep:
        self.turns += 1
        digits = sum(c.isdigit() for c in model_turn) / max(len(model_turn), 1)
        if self.turns == 2:
            return EnvStep(reward=digits, done=True)
        return EnvStep([{"role": "tool", "content": "12"}], reward=digits, tool_calls=1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import GenerationConfig

    from grpolab.tasks.tiny import CHAT_TEMPLATE, build_char_tokenizer, build_tiny_model

    path = tmp_path_factory.mktemp("vllm_chat")
    tok = build_char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    build_tiny_model(tok, hidden_size=64, num_layers=2, num_heads=2).save_pretrained(path)
    tok.save_pretrained(path)
    stops = [tok.eos_token_id, *tok.convert_tokens_to_ids(list(STOPS))]
    GenerationConfig(eos_token_id=stops, pad_token_id=tok.pad_token_id).save_pretrained(path)
    return str(path)


def overrides(model_dir, out=".", name="run", steps=1) -> list[str]:
    return [
        f"model.name_or_path={model_dir}", "model.autocast=none", "data.source=multiplication", "data.size=16",
        "data.max_prompt_length=32", f"env.name={__name__}:TwoTurns", "env.max_turns=3",
        "env.max_episode_tokens=40", "reward.functions=[{name: env}]", "rollout.engine=vllm",
        "rollout.num_generations=4", f"rollout.max_completion_length={MAX_NEW}", "train.prompts_per_step=2",
        f"train.num_steps={steps}", "optim.lr=1e-2", "vllm.dtype=float32", "vllm.kv_cache_space_gb=0.0625",
        f"log.output_dir={out}", f"log.run_name={name}", "log.progress=false", "log.checkpoint_every=1",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def engine(model_dir):
    """The engine the training run's settings start (same key in the process's engine cache)."""
    from transformers import AutoConfig

    context = AutoConfig.from_pretrained(model_dir).max_position_embeddings
    cfg = load_config(None, overrides(model_dir))
    yield start_engine(**engine_kwargs(engine_spec(cfg), device_type="cpu", autocast_dtype=None, context=context))
    shutdown_engines()


@pytest.fixture(scope="module")
def tok(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


class Recording(Sampler):
    """The inner sampler, keeping what each model turn drew."""

    def __init__(self, inner) -> None:
        self.inner, self.pad_token_id, self.turns = inner, inner.pad_token_id, []

    def sample(self, prompt_ids, *, num_generations, generator=None):
        out = self.inner.sample(prompt_ids, num_generations=num_generations, generator=generator)
        self.turns.append([(out.completion_ids[i, :n].tolist(), out.logprobs[i, :n]) for i, n in enumerate(out.lengths)])
        return out


def test_vllm_episode_layout_and_logprobs_equal_the_trainers(engine, tok, model_dir):
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    stops = [tok.eos_token_id, *tok.convert_tokens_to_ids(list(STOPS))]
    inner = VLLMSampler(engine, tok, max_completion_length=MAX_NEW, temperature=0.7, eos_token_ids=stops, weights_from=policy)
    recording = Recording(inner)
    sampler = MultiTurnSampler(recording, tok, TwoTurns, max_turns=3, max_episode_tokens=40)
    examples = [Example("12*3=", "36"), Example("7+5=", "12")]
    prompts = episode_prompt_ids(examples, tok, TwoTurns)
    out = sampler.sample(prompts, num_generations=4, examples=examples, generator=torch.Generator().manual_seed(0))

    tool = [{"role": "tool", "content": "12"}]
    assert sampler.delta.text(tool) == " <tool>12 <assistant>"  # the template's text after a model turn
    env = tok(" <tool>12 <assistant>", add_special_tokens=False)["input_ids"]
    first, second = recording.turns[0], recording.turns[1] if len(recording.turns) > 1 else []
    went_on = iter(second)
    two_turn = 0
    for row, (ids1, lp1) in enumerate(first):
        layout, sampled, logprobs = list(ids1), [True] * len(ids1), list(lp1.tolist())
        if ids1[-1] in stops:  # the first turn ended on a stop token: the tool answered (the second turn
            # may then run to its limit: the episode's finish reason is "length", yet it went on)
            ids2, lp2 = next(went_on)
            layout += env + ids2
            sampled += [False] * len(env) + [True] * len(ids2)
            logprobs += [0.0] * len(env) + lp2.tolist()
            two_turn += 1
        n = len(layout)
        assert out.completion_ids[row, :n].tolist() == layout and out.completion_mask[row].sum() == n
        assert out.sampled_mask[row, :n].tolist() == sampled and not out.sampled_mask[row, n:].any()
        torch.testing.assert_close(out.logprobs[row, :n], torch.tensor(logprobs), atol=0, rtol=0)
    assert two_turn >= 2 and next(went_on, None) is None  # episodes with env tokens between two model turns

    with torch.no_grad():
        trainer, _ = completion_logprobs(
            policy, out.prompt_ids, out.completion_ids, out.completion_mask, pad_id=tok.pad_token_id, temperature=0.7
        )
    model = out.model_mask
    # fp32 on both sides, different kernels: ~1e-6 nats apart; a mis-laid token is off by whole nats
    torch.testing.assert_close(out.logprobs[model], trainer[model], atol=1e-4, rtol=0)


def test_grpo_with_an_environment_on_vllm(engine, model_dir, tmp_path):
    rows = read_metrics(train(load_config(None, overrides(model_dir, tmp_path, "agent", 2))).run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert 1 <= row["num_turns/mean"] <= 2 and row["num_turns/max"] == 2
        assert 0 < row["rollout/model_token_frac"] < 1  # env tokens in the episodes, masked out
        assert row["sampling/sampling_logp_difference/mean"] < 1e-4  # the engine took every update
