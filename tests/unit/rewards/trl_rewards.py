"""Reward functions written the way TRL's GRPOTrainer documentation writes them (used unchanged by grpolab)."""

import asyncio
import re

from math_verify import LatexExtractionConfig, parse, verify


def format_reward(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    matches = [re.match(pattern, content) for content in completions]
    return [1.0 if match else 0.0 for match in matches]


def conversational_format_reward(completions, **kwargs):
    """The same check for conversational data: each completion is a list of messages."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def accuracy_reward(completions, solution, **kwargs):
    """Reward function that checks if the completion matches the ground truth (math-verify)."""
    rewards = []
    for content, sol in zip(completions, solution, strict=True):
        gold_parsed = parse(sol, extraction_mode="first_match", extraction_config=[LatexExtractionConfig()])
        if len(gold_parsed) != 0:
            answer_parsed = parse(content, extraction_mode="first_match")
            rewards.append(float(verify(gold_parsed, answer_parsed)))
        else:
            rewards.append(None)  # skip this example
    return rewards


def length_penalty(completion_ids, target=4, **kwargs):
    """Penalise the distance from a target length, in tokens (TRL passes completion_ids)."""
    return [-abs(target - len(ids)) / target for ids in completion_ids]


def echo_columns(prompts, completions, completion_ids, **kwargs):
    """Records what it was given, for the tests; rewards 1.0."""
    echo_columns.seen = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids, **kwargs}
    return [1.0] * len(completions)


def no_kwargs(completions, solution):
    """A function without **kwargs gets only what it names."""
    return [float(c == s) for c, s in zip(completions, solution, strict=True)]


_arrived: list[str] = []


async def _meet(me: str) -> None:
    """Wait (at most a second) until both async rewards have started: only true when they run together."""
    _arrived.append(me)
    for _ in range(1000):
        if {"left", "right"} <= set(_arrived):
            return
        await asyncio.sleep(0.001)
    raise RuntimeError(f"{me} ran alone: async rewards were not awaited together")


async def async_left(completions, **kwargs):
    await _meet("left")
    return [0.25] * len(completions)


async def async_right(completions, **kwargs):
    await _meet("right")
    return [0.5] * len(completions)


def reset_meeting() -> None:
    _arrived.clear()


def wrong_length(completions, **kwargs):
    return [1.0]


def returns_nan(completions, **kwargs):
    return [float("nan")] * len(completions)


def raises(completions, **kwargs):
    raise KeyError("boom")


def needs_trainer_state(completions, trainer_state, **kwargs):
    return [float(trainer_state.global_step)] * len(completions)


def looks_native(completion, example):
    """A grpolab per-sample function, for the kind override."""
    return float(len(completion.text))


def slow(completions, **kwargs):
    """Python-level work that never ends in time (sympy stuck on an adversarial answer, say)."""
    import time

    end = time.monotonic() + 30
    while time.monotonic() < end:
        sum(range(1000))
    return [0.0] * len(completions)


def conversational_accuracy_reward(completions, solution, **kwargs):
    """accuracy_reward for conversational data, as TRL's docs write it: the content of the first message."""
    return accuracy_reward([completion[0]["content"] for completion in completions], solution)
