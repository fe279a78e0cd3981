"""Multi-turn episodes: exact token layout, limits, log-probs equal to the trainer's, env tokens get no
gradient, and a 2-turn episode's loss equals the loss of the same tokens laid out by hand."""

from __future__ import annotations

import pytest
import torch

from grpolab.config import load_config
from grpolab.envs import EnvStep, ToolLimits, build_environment
from grpolab.rollout.base import Sampler
from grpolab.rollout.hf import HFSampler
from grpolab.rollout.multiturn import ChatDelta, MultiTurnSampler, episode_prompt_ids
from grpolab.runtime.step_spec import batch_builder, policy_loss_spec
from grpolab.tasks.tiny import CHAT_TEMPLATE
from grpolab.training.batch import rewards_tensor
from grpolab.training.logprobs import completion_logprobs
from grpolab.training.step import policy_loss
from grpolab.types import Completions, Example

EXAMPLE = Example("12*3=", "36")


@pytest.fixture(scope="module")
def chat_tok(tok):
    tok.chat_template = CHAT_TEMPLATE
    return tok


def calc_env():
    return build_environment("calculator", {"call_format": "python"}, ToolLimits())


class Scripted(Sampler):
    """An inner sampler that answers a context with a fixed turn: a call first, the result's number after."""

    def __init__(self, tok, wrong: bool = False):
        self.tok, self.wrong, self.pad_token_id = tok, wrong, tok.pad_token_id

    def sample(self, prompt_ids, *, num_generations, generator=None, examples=None):
        assert num_generations == 1
        rows = []
        for ids in prompt_ids:
            seen = self.tok.decode(ids)
            text = ("35" if self.wrong else "36") if "<tool>" in seen else "calculator(12*3)"
            rows.append(self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id])
        width = max(map(len, rows))
        ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
        mask = torch.tensor([[j < len(r) for j in range(width)] for r in rows])
        return Completions(
            [list(p) for p in prompt_ids], ids, mask, -0.5 * mask.float(), ["?"] * len(rows), ["stop"] * len(rows), 1
        )


def enc(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_the_episode_is_the_sampled_ids_plus_the_env_delta(chat_tok):
    tok = chat_tok
    prompt = episode_prompt_ids([EXAMPLE], tok, calc_env())
    assert prompt == [[tok.bos_token_id, *enc(tok, "<user>12*3= <assistant>")]]
    sampler = MultiTurnSampler(Scripted(tok), tok, calc_env(), max_turns=3, max_episode_tokens=64)
    out = sampler.sample(prompt, num_generations=2, examples=[EXAMPLE])
    turn1 = enc(tok, "calculator(12*3)") + [tok.eos_token_id]
    env = enc(tok, " <tool>36 <assistant>")  # the template's text after the model's turn, by hand
    turn2 = enc(tok, "36") + [tok.eos_token_id]
    expected = turn1 + env + turn2
    assert out.completion_ids.shape == (2, len(expected))
    assert out.completion_ids[0].tolist() == expected
    sampled = [True] * len(turn1) + [False] * len(env) + [True] * len(turn2)
    assert out.sampled_mask[0].tolist() == sampled and out.completion_mask.all()
    assert out.logprobs[0].tolist() == [-0.5 if s else 0.0 for s in sampled]
    ep = out.episodes[1]
    assert (ep.env_reward, ep.turns, ep.tool_calls, ep.tool_errors) == (1.0, 2, 1, 0)
    assert ep.turn_ends == (len(turn1) - 1, len(expected) - 1) and ep.turn_rewards == (None, 1.0)
    assert [m["role"] for m in ep.messages] == ["user", "assistant", "tool", "assistant"]
    assert out.finish_reasons == ["stop", "stop"]
    assert out.items()[0].episode is ep or out.items()[0].episode.env_reward == 1.0


def test_limits_truncate_and_mark_length(chat_tok):
    tok = chat_tok
    prompt = episode_prompt_ids([EXAMPLE], tok, calc_env())
    one_turn = MultiTurnSampler(Scripted(tok), tok, calc_env(), max_turns=1, max_episode_tokens=64)
    out = one_turn.sample(prompt, num_generations=1, examples=[EXAMPLE])
    assert out.finish_reasons == ["length"] and out.episodes[0].env_reward is None
    assert out.completion_ids.shape[1] == 17 and out.sampled_mask.all()  # no env tokens after the last turn
    short = MultiTurnSampler(Scripted(tok), tok, calc_env(), max_turns=3, max_episode_tokens=10)
    out = short.sample(prompt, num_generations=1, examples=[EXAMPLE])
    assert out.finish_reasons == ["length"] and out.completion_ids.shape[1] == 10  # the turn cut at the budget
    no_room = MultiTurnSampler(Scripted(tok), tok, calc_env(), max_turns=3, max_episode_tokens=17 + 21)
    out = no_room.sample(prompt, num_generations=1, examples=[EXAMPLE])
    assert out.finish_reasons == ["length"] and out.completion_ids.shape[1] == 17  # env message did not fit


class Nag:
    """An environment that never ends: "again" after every turn (async, as built-in tools are)."""

    tools: list = []

    def reset(self, example):
        return [{"role": "user", "content": example.prompt}]

    async def step(self, model_turn):
        return EnvStep([{"role": "user", "content": "again"}], reward=0.25)


def test_recomputed_logprobs_equal_the_samplers(chat_tok, eos_model):
    tok = chat_tok
    inner = HFSampler(eos_model, tok, max_completion_length=6)
    sampler = MultiTurnSampler(inner, tok, Nag, max_turns=3, max_episode_tokens=60)
    prompts = episode_prompt_ids([EXAMPLE, Example("7+8=")], tok, Nag)
    out = sampler.sample(prompts, num_generations=3, generator=torch.Generator().manual_seed(0), examples=[EXAMPLE, Example("7+8=")])
    assert (~out.sampled_mask & out.completion_mask).any()  # env tokens sit between model turns
    assert {e.env_reward for e in out.episodes if e.turns == 3} <= {0.75}
    with torch.no_grad():
        lp, _ = completion_logprobs(eos_model, out.prompt_ids, out.completion_ids, out.completion_mask, pad_id=tok.pad_token_id)
    m = out.model_mask
    torch.testing.assert_close(lp[m], out.logprobs[m], atol=2e-5, rtol=0)


def _cfg(extra=()):
    return load_config(None, ["model.name_or_path=x", "rollout.num_generations=2", "algo.beta=0.1", "algo.loss_agg=token-mean", *extra])


def _episodes(tok, wrong_second: bool):
    prompt = episode_prompt_ids([EXAMPLE], tok, calc_env())
    right = MultiTurnSampler(Scripted(tok), tok, calc_env(), max_turns=3, max_episode_tokens=64).sample(prompt, num_generations=1, examples=[EXAMPLE])
    wrong = MultiTurnSampler(Scripted(tok, wrong=wrong_second), tok, calc_env(), max_turns=3, max_episode_tokens=64).sample(prompt, num_generations=1, examples=[EXAMPLE])
    return prompt, Completions(
        right.prompt_ids + wrong.prompt_ids,
        torch.cat([right.completion_ids, wrong.completion_ids]),
        torch.cat([right.completion_mask, wrong.completion_mask]),
        torch.cat([right.logprobs, wrong.logprobs]),
        right.texts + wrong.texts,
        right.finish_reasons + wrong.finish_reasons,
        2,
        sampled_mask=torch.cat([right.sampled_mask, wrong.sampled_mask]),
        episodes=right.episodes + wrong.episodes,
    )


def _pipeline_loss(model, tok, cfg, prompt, comps):
    rewards, valid = rewards_tensor([e.env_reward for e in comps.episodes], 1, 2)
    batch, _ = batch_builder(cfg, None, None)(comps, prompt, rewards, valid, policy=model, reference=None)
    lp, _ = completion_logprobs(model, batch.prompt_ids, batch.completion_ids, batch.completion_mask, pad_id=tok.pad_token_id)
    lp.retain_grad()
    batch.ref_logprobs = lp.detach() - 0.3 * batch.completion_mask  # a KL term that would push every token
    loss, _ = policy_loss(lp, lp.detach(), batch, policy_loss_spec(cfg), total_seqs=2, total_tokens=float(batch.loss_mask.sum()))
    return loss, lp, batch


def test_env_tokens_get_no_gradient(chat_tok, model):
    prompt, comps = _episodes(chat_tok, wrong_second=True)
    model.zero_grad()
    loss, lp, batch = _pipeline_loss(model, chat_tok, _cfg(), prompt, comps)
    loss.backward()
    env = comps.completion_mask & ~comps.sampled_mask
    assert env.sum() == 42  # " <tool>36 <assistant>": 21 env tokens in each episode
    assert (lp.grad[env] == 0).all()
    assert (lp.grad[comps.model_mask] != 0).all()  # advantage and KL reach every model token
    assert not (batch.loss_mask & env).any()


def test_two_turn_loss_equals_the_hand_laid_out_loss(chat_tok, model):
    """GRPO at ratio 1, beta=0: grad = -(1/n_model) * sum_i A_i * sum_{model t} grad log p(t). By hand: one
    forward of prompt + the episode's tokens written out, only the model's tokens summed."""
    tok = chat_tok
    cfg = _cfg(["algo.beta=0"])
    prompt, comps = _episodes(tok, wrong_second=True)
    model.zero_grad()
    loss, _, _ = _pipeline_loss(model, tok, cfg, prompt, comps)
    loss.backward()
    got = model.model.embed_tokens.weight.grad.clone()
    turn1 = enc(tok, "calculator(12*3)") + [tok.eos_token_id]
    env = enc(tok, " <tool>36 <assistant>")
    a = 0.5 / (0.5**0.5 + 1e-4)  # rewards (1, 0): (r - mean) / (std + eps), std 0.7071 (unbiased), eps 1e-4
    advantages = [a, -a]
    model.zero_grad()
    hand = 0.0
    n_model = 0
    for answer, adv in zip(["36", "35"], advantages, strict=True):
        turn2 = enc(tok, answer) + [tok.eos_token_id]
        seq = torch.tensor([prompt[0] + turn1 + env + turn2])
        logp = torch.log_softmax(model(seq).logits[0, :-1].float(), -1).gather(-1, seq[0, 1:, None])[:, 0]
        start = len(prompt[0]) - 1  # logits at i predict token i + 1
        picks = list(range(start, start + len(turn1))) + list(range(start + len(turn1) + len(env), seq.shape[1] - 1))
        hand = hand - adv * logp[picks].sum()
        n_model += len(picks)
    (hand / n_model).backward()
    want = model.model.embed_tokens.weight.grad
    assert want.abs().max() > 1e-4
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_chat_delta_on_a_qwen_style_template(chat_tok):
    """A template whose assistant turn ends with the EOS text then a separator (Qwen's "<|im_end|>\n"; "."
    here, which the character vocabulary has): the separator is env context, the model's EOS is its own."""
    tok = chat_tok
    saved = tok.chat_template
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{{ eos_token }}.{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    try:
        ids = ChatDelta(tok).ids([{"role": "tool", "content": "36"}])
        assert tok.decode(ids) == ".<tool>36<eos>.<assistant>"
    finally:
        tok.chat_template = saved


def test_chat_delta_renders_with_the_template_kwargs(chat_tok):
    """data.chat_template_kwargs (TRL's chat_template_kwargs) reach the episode's prompt and its env messages."""
    tok = chat_tok
    saved = tok.chat_template
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% if not thinking %}<nothink>{% endif %}{% endif %}"
    )
    try:
        delta = ChatDelta(tok, None, {"thinking": False})
        assert tok.decode(delta.prompt_ids([{"role": "user", "content": "q"}])) == "<user>q<eos><assistant><nothink>"
        assert tok.decode(delta.ids([{"role": "tool", "content": "36"}])) == "<tool>36<eos><assistant><nothink>"
        assert tok.decode(ChatDelta(tok, None, {"thinking": True}).ids([{"role": "tool", "content": "36"}])) == (
            "<tool>36<eos><assistant>"
        )
    finally:
        tok.chat_template = saved


QWEN25_TOOLS = (  # Qwen2.5-Instruct's template, its tool parts (assistant tool_calls left out: not used here)
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{{- 'You are Qwen.' }}"
    "{{- '\\n\\n# Tools\\n\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_chat_delta_on_qwen25s_tool_template():
    """Tool results grouped under one user turn, the "\\n" after the model's <|im_end|> as env context, the
    tools declared in the prompt's system turn."""
    from grpolab.envs.base import Tool
    from grpolab.envs.tools import calculator
    from grpolab.tasks.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.add_special_tokens({"eos_token": "<|im_end|>"})
    tok.chat_template = QWEN25_TOOLS
    tools = [Tool.from_function(calculator).schema]
    delta = ChatDelta(tok, tools)
    one = delta.text([{"role": "tool", "name": "calculator", "content": "5535"}])
    assert one == "\n<|im_start|>user\n<tool_response>\n5535\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    two = delta.text([{"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}])
    assert two == (
        "\n<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    prompt = tok.apply_chat_template([{"role": "user", "content": "q"}], tools=tools, tokenize=False, add_generation_prompt=True)
    assert '"name": "calculator"' in prompt and prompt.endswith("<|im_start|>assistant\n")


class Slow:
    """An environment whose step waits 0.4 s on an async tool, then ends the episode."""

    tools: list = []

    def reset(self, example):
        return [{"role": "user", "content": example.prompt}]

    async def step(self, model_turn):
        import asyncio

        await asyncio.sleep(0.4)
        return EnvStep(reward=1.0, done=True)


def test_many_episodes_wait_on_their_tools_at_once(chat_tok):
    import time

    sampler = MultiTurnSampler(Scripted(chat_tok), chat_tok, Slow, max_turns=2, max_episode_tokens=64)
    prompts = episode_prompt_ids([EXAMPLE], chat_tok, Slow)
    t0 = time.perf_counter()
    out = sampler.sample(prompts, num_generations=8, examples=[EXAMPLE])
    elapsed = time.perf_counter() - t0
    assert [e.env_reward for e in out.episodes] == [1.0] * 8
    assert elapsed < 1.6, elapsed  # one after the other: 8 x 0.4 = 3.2 s
