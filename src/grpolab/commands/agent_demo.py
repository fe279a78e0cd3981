"""``grpolab demo --agent``: a tiny model learns to use a calculator, SFT then GRPO on episodes, on a CPU.

1. A character tokenizer with a chat template and a tiny Qwen2 model, built in code.
2. SFT on traces laid out exactly as the rollout lays out episodes (rollout.multiturn.ChatDelta): half
   call the tool (``calculator(123*45)``, the tool's answer as context, then the product), half answer
   directly (the product, which a 2-layer model cannot compute). Loss on the model's tokens only.
3. GRPO through ``grpolab.commands.train.train`` with ``env.name=calculator``: G episodes per prompt,
   reward 1 when the final answer is the product.
4. Held-out evaluation of both models: accuracy and tool-call rate with the tool, and accuracy with the
   tool disabled (every call answers an error) for contrast; ``<run>/report.md``.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from grpolab.commands.demo import own_config
from grpolab.commands.packaged import final_checkpoint, packaged_config, stop_if_interrupted, with_model
from grpolab.commands.train import train
from grpolab.config import Config
from grpolab.data import load_examples, split_eval
from grpolab.envs.setup import environment_from_config
from grpolab.jsonio import write_whole
from grpolab.rollout.base import without_failures
from grpolab.rollout.hf import HFSampler
from grpolab.rollout.multiturn import ChatDelta, MultiTurnSampler, episode_prompt_ids
from grpolab.runtime.logging import read_metrics
from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model
from grpolab.training.logprobs import completion_logprobs
from grpolab.training.optim import adamw

SIZES: dict[str, tuple[dict[str, int], list[str]]] = {
    "full": ({"hidden_size": 128, "num_layers": 2, "num_heads": 4}, []),
    "tiny": (  # for tests: seconds, not a result
        {"hidden_size": 32, "num_layers": 1, "num_heads": 2},
        ["data.size=240", "data.eval_size=8", "sft.steps=3", "sft.batch_size=8", "train.num_steps=2",
         "train.prompts_per_step=2", "rollout.num_generations=2"],
    ),
}  # fmt: skip


@dataclass(frozen=True)
class AgentEval:
    label: str
    accuracy: float
    """Final answers right, with the calculator (one episode per prompt at the rollout temperature)."""
    tool_call_rate: float
    """Episodes that called the tool at least once."""
    accuracy_no_tool: float
    """The same model with every tool call answered by an error."""
    greedy_accuracy: float
    """With the calculator, greedy decoding."""


def agent_config(out_dir: str | Path, size: str = "full", overrides: Sequence[str] = ()) -> Config:
    """The agent demo's config (package data) with the size preset, the output folder and ``overrides``."""
    return packaged_config("demo_agent.yaml", SIZES, out_dir, size, overrides)


def run_agent_demo(out_dir: str | Path = "runs/demo-agent", size: str = "full", overrides: Sequence[str] = ()):
    """SFT, GRPO, evaluate before and after; returns (report path, [AgentEval], seconds)."""

    cfg = own_config(agent_config(out_dir, size, overrides), "demo --agent")
    run_dir, seconds = cfg.run_dir, {}
    t0 = time.perf_counter()
    examples, held_out = split_eval(load_examples(cfg.data, seed=cfg.seed), cfg.data.eval_size)
    sft_dir = _sft(cfg, examples, SIZES[size][0])
    seconds["sft"] = time.perf_counter() - t0
    grpo_cfg = with_model(cfg, str(sft_dir))
    t1 = time.perf_counter()
    trained = train(grpo_cfg)
    seconds["grpo"] = time.perf_counter() - t1
    stop_if_interrupted(trained)  # Ctrl-C during GRPO: its checkpoint is saved; no eval, no report
    final = final_checkpoint(trained)
    t2 = time.perf_counter()
    evals = [evaluate_agent(cfg, str(sft_dir), held_out, "SFT"), evaluate_agent(cfg, str(final), held_out, "GRPO")]
    seconds["eval"] = time.perf_counter() - t2
    seconds["total"] = time.perf_counter() - t0
    report = _write_report(run_dir, cfg, evals, seconds, grpo_steps=trained.final_step)
    return report, evals, seconds


AGENT_TEMPLATE = (  # no spaces: a saved character tokenizer reloads (as Qwen2Tokenizer) without them
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _tokenizer(path: Path):
    """The character tokenizer with the agent template, saved to ``path`` and read back: the SFT traces,
    the GRPO run and the evaluation all tokenize with the tokenizer the model folder holds."""
    from transformers import AutoTokenizer

    tok = build_char_tokenizer()
    tok.chat_template = AGENT_TEMPLATE
    tok.save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def _make_env(cfg: Config, tools_enabled: bool = True):

    kwargs = {**cfg.env.kwargs, "tools_enabled": tools_enabled}
    return environment_from_config(dataclasses.replace(cfg.env, kwargs=kwargs))


def sft_traces(examples, tok, make_env, *, seed: int, tool_fraction: float = 0.5):
    """(prompt ids [n], episode ids [n], sampled mask [n]) laid out as the rollout lays out episodes."""

    delta = ChatDelta(tok, make_env().tools)
    rng = random.Random(seed)
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]  # noqa: E731
    prompts, episodes, masks = [], [], []
    for e in examples:
        prompts.append(delta.prompt_ids(make_env().reset(e)))
        if rng.random() < tool_fraction:
            call, env = enc(f"calculator({e.prompt.rstrip('=')})"), delta.ids([{"role": "tool", "name": "calculator", "content": e.answer}])
            ids, mask = call + env + enc(e.answer), [True] * len(call) + [False] * len(env) + [True] * (len(e.answer) + 1)
        else:
            ids = enc(e.answer)
            mask = [True] * len(ids)
        episodes.append(ids)
        masks.append(mask)
    return prompts, episodes, masks


def _sft(cfg: Config, examples, shape: dict[str, int]) -> Path:
    """Masked next-token SFT on the traces (model tokens only); saves the model to cfg.sft_dir."""

    out = cfg.sft_dir
    tok = _tokenizer(out)
    model = build_tiny_model(tok, seed=cfg.seed, **shape)
    prompts, episodes, masks = sft_traces(examples, tok, _make_env(cfg), seed=cfg.seed)
    opt = adamw(model, lr=cfg.sft.lr, weight_decay=0.01)  # torch's default decay, which the demo was tuned with
    gen = torch.Generator().manual_seed(cfg.seed)
    model.train()
    for _ in range(cfg.sft.steps):
        rows = torch.randint(len(prompts), (cfg.sft.batch_size,), generator=gen).tolist()
        width = max(len(episodes[i]) for i in rows)
        ids = torch.tensor([episodes[i] + [tok.pad_token_id] * (width - len(episodes[i])) for i in rows])
        sampled = torch.tensor([masks[i] + [False] * (width - len(masks[i])) for i in rows])
        counted = torch.tensor([[j < len(episodes[i]) for j in range(width)] for i in rows])
        logprobs, _ = completion_logprobs(model, [prompts[i] for i in rows], ids, counted, pad_id=tok.pad_token_id)
        loss = -(logprobs * sampled).sum() / sampled.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.save_pretrained(out)
    return out


def evaluate_agent(cfg: Config, path: str, examples, label: str) -> AgentEval:
    """Accuracy and tool-call rate of one episode per held-out prompt, with and without the tool."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    results = {}
    for name, temperature, tools in (("sampled", 1.0, True), ("greedy", 0.0, True), ("no_tool", 1.0, False)):
        make_env = _make_env(cfg, tools_enabled=tools)
        inner = HFSampler(model, tok, max_completion_length=cfg.rollout.max_completion_length, temperature=temperature)
        sampler = MultiTurnSampler(
            inner, tok, make_env, max_turns=cfg.env.max_turns, max_episode_tokens=cfg.env.max_episode_tokens,
            step_timeout_s=cfg.env.step_timeout_s, max_retries=cfg.env.max_retries,
        )
        prompts = episode_prompt_ids(examples, tok, make_env)
        out = sampler.sample(prompts, num_generations=1, generator=torch.Generator().manual_seed(cfg.seed), examples=examples)
        without_failures(out, f"agent demo ({name})")
        rewards = [e.env_reward or 0.0 for e in out.episodes]
        results[name] = (sum(rewards) / len(rewards), sum(e.tool_calls > 0 for e in out.episodes) / len(rewards))
    return AgentEval(label, results["sampled"][0], results["sampled"][1], results["no_tool"][0], results["greedy"][0])


def _write_report(
    run_dir: Path, cfg: Config, evals: list[AgentEval], seconds: dict[str, float], *, grpo_steps: int
) -> Path:
    """report.md and agent_eval.json, each written whole (a temporary file renamed into place); the GRPO
    steps said are the steps that ran."""

    rows = read_metrics(run_dir)
    curve = [(r["step"], r.get("reward"), r.get("tools/call_frequency")) for r in rows]
    every = max(len(curve) // 10, 1)
    lines = [
        "# grpolab demo --agent: a tiny model learns to use a calculator",
        "",
        f"Task: {cfg.data.params.get('digits', 3)}-digit x {cfg.data.params.get('digits_b', 2)}-digit multiplication; "
        f"{cfg.data.eval_size} held-out prompts. Tool: `calculator(expr)` (env `{cfg.env.name}`), "
        f"at most {cfg.env.max_turns} turns. Reward: 1 when the final answer is the product.",
        "",
        "| model | accuracy with the tool | tool-call rate | accuracy, tool disabled | greedy accuracy with the tool |",
        "|---|---:|---:|---:|---:|",
        *(f"| {e.label} | {e.accuracy:.3f} | {e.tool_call_rate:.3f} | {e.accuracy_no_tool:.3f} | {e.greedy_accuracy:.3f} |" for e in evals),
        "",
        f"SFT: {cfg.sft.steps} steps of batch {cfg.sft.batch_size} on traces, half with a tool call. "
        f"GRPO: {grpo_steps} steps of {cfg.train.prompts_per_step} prompts x G={cfg.rollout.num_generations} episodes.",
        "",
        "| GRPO step | reward | tool calls per episode |",
        "|---:|---:|---:|",
        *(f"| {s} | {r:.3f} | {c:.2f} |" for s, r, c in curve[::every] if r is not None and c is not None),
        "",
        "Time: " + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()),
        "",
    ]
    report = run_dir / "report.md"
    write_whole(run_dir / "agent_eval.json", json.dumps([dataclasses.asdict(e) for e in evals], indent=2))
    write_whole(report, "\n".join(lines))
    return report


def print_agent_summary(report: Path, evals: list[AgentEval], seconds: dict[str, float]) -> None:
    for e in evals:
        print(
            f"{e.label}: accuracy {e.accuracy:.3f} with the tool (calls it in {e.tool_call_rate:.0%} of episodes), "
            f"{e.accuracy_no_tool:.3f} without; greedy {e.greedy_accuracy:.3f}"
        )
    print("Time: " + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()) + f". Report: {report}")
