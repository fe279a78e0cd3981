"""Multi-turn episodes over any Sampler: the model acts, the environment answers, token in, token out.

An episode is laid out as one completion after its prompt::

    prompt | model turn 1 (sampled, ends with EOS) | env message ids | model turn 2 | ... | last turn

* The model's tokens are the exact ids the sampler drew, with its log-probs; nothing is decoded and
  re-tokenized across turns (the decoded text only goes to the environment).
* The environment's messages are tokenized alone, as the chat template's *delta*: the text the
  template puts after an assistant turn's end-of-turn token for those messages, up to and including
  the next assistant header (``ChatDelta``). The tokens before them are never re-rendered.
* ``completion_mask`` is True over the whole episode (the trainer runs it all as context);
  ``sampled_mask`` is True only on the model's tokens, so env tokens get no loss and no KL.
* Limits: ``max_turns`` model turns, ``max_episode_tokens`` tokens after the prompt (model and env).
  An episode that hits either without the environment saying done is truncated: finish_reason
  "length", as a single completion cut at max_completion_length. A turn that overruns the episode
  budget is cut there (its kept tokens' log-probs are exact: causal). Each turn is at most the inner
  sampler's max_completion_length.
* Rewards: the environment's per-turn rewards are summed into ``Episode.env_reward``; each turn's own
  reward and last token are kept (``Episode.turn_rewards``, ``turn_ends``: process supervision's steps).
* A group is G episodes of the same prompt (rows prompt-major, as every Sampler).
* Failures (docs/training.md, "Failed samples"): an episode whose environment raised (``make_env``,
  ``reset``, ``step``: a ConnectionResetError from a remote service that is gone), broke the contract or
  did not answer within ``step_timeout_s``, or whose model turn the engine failed, is run again from a
  fresh environment, up to ``max_retries`` times (tinker-cookbook's retry); then it fails
  (``Completions.failures``) and the trainer drops its whole group. A step that blocks the event loop
  stops every episode still running in it: they fail at once, with no retry (the loop is stuck).

Each turn calls the inner sampler on every running episode's full context (prompt + episode so far,
one sample each): any Sampler that continues given token ids works (hf re-prefills the context; an
engine with prefix caching reuses it).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grpolab.config.sections import EnvConfig
from grpolab.envs.base import Environment, EnvStep, Message
from grpolab.envs.contract import EnvLoop, EnvTimedOut, checked_reset, env_failure, env_name, guarded_step
from grpolab.errors import ConfigError, one_line
from grpolab.rollout.base import Sampler
from grpolab.types import Completions, Episode, Example, Failure, FinishReason

log = logging.getLogger(__name__)

_MARK = "q7Zx9"
"""The dummy assistant turn's text: a string no template writes by itself."""


class ChatDelta:
    """Token ids of environment messages, as the chat template lays them out after a model turn."""

    def __init__(self, tokenizer, tools: Sequence | None = None, template_kwargs: Mapping[str, Any] | None = None) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ConfigError(
                "env: the tokenizer has no chat template, and an environment's messages are laid out with "
                "one: use a chat model's tokenizer (model.tokenizer) or set tokenizer.chat_template"
            )
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools else None
        self.template_kwargs = dict(template_kwargs or {})  # data.chat_template_kwargs (TRL's chat_template_kwargs)
        self._prefix = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _MARK}]
        rendered = self._render(self._prefix, generation_prompt=False)
        cut = rendered.rindex(_MARK) + len(_MARK)
        ends = [t for t in _end_tokens(tokenizer) if rendered.startswith(t, cut)]
        self._cut = cut + len(ends[0]) if ends else cut  # the model's own EOS ends its turn
        self._head = rendered[: self._cut]

    def _render(self, messages, *, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=self.tools, tokenize=False, add_generation_prompt=generation_prompt, **self.template_kwargs
        )

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The first messages with the tools declared and the assistant header, as ids."""
        text = self._render(list(messages), generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def text(self, messages: Sequence[Message]) -> str:
        """The text that follows a model turn (after its EOS) for ``messages``, then the next assistant header."""
        full = self._render([*self._prefix, *messages], generation_prompt=True)
        if not full.startswith(self._head):
            raise ConfigError(
                "env: the chat template renders earlier turns differently once environment messages follow "
                "(it is not append-only), so their tokens cannot be laid out after the model's; use another template"
            )
        return full[self._cut :]

    def ids(self, messages: Sequence[Message]) -> list[int]:
        """``text(messages)`` as token ids, tokenized alone (the model's tokens before it are never touched)."""
        return self.tokenizer(self.text(messages), add_special_tokens=False)["input_ids"]


def _end_tokens(tokenizer) -> list[str]:
    """The tokenizer's end-of-sequence strings, longest first."""
    names = [tokenizer.eos_token, *getattr(tokenizer, "additional_special_tokens", [])]
    return sorted({n for n in names if n}, key=len, reverse=True)


def episode_prompt_ids(
    examples: Sequence[Example], tokenizer, make_env: Callable[[], Environment], template_kwargs: Mapping[str, Any] | None = None
) -> list[list[int]]:
    """Each example's first messages (``env.reset``) rendered with the env's tools (and ``template_kwargs``,
    data.chat_template_kwargs): the training prompts."""
    delta = ChatDelta(tokenizer, make_env().tools, template_kwargs)
    return [delta.prompt_ids(checked_reset(env, env.reset(e))) for e in examples for env in [make_env()]]


@dataclass
class _Running:
    """One episode while it runs."""

    prompt: list[int]
    example: Example
    env: Environment | None = None
    messages: list[Message] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    sampled: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    reward: float | None = None
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    turn_ends: list[int] = field(default_factory=list)
    turn_rewards: list[float | None] = field(default_factory=list)
    finish: FinishReason | None = None
    failure: Failure | None = None
    """Why the episode failed, once its retries are spent (it is then finished)."""
    retries: int = 0

    def restart(self, env: Environment, messages: list[Message]) -> None:
        """Start (again) with ``env``, reset to ``messages``: whatever an earlier attempt sampled is dropped."""
        self.env, self.messages = env, messages
        self.ids, self.sampled, self.logprobs, self.turn_ends, self.turn_rewards = [], [], [], [], []
        self.reward, self.turns, self.tool_calls, self.tool_errors, self.finish = None, 0, 0, 0, None

    def add(self, ids: list[int], logprobs: list[float] | None) -> None:
        self.ids += ids
        self.sampled += [logprobs is not None] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    def end_turn(self) -> None:
        """The model's turn just added ends here (a step of process supervision)."""
        self.turns += 1
        last = len(self.ids) - 1
        if self.sampled and self.sampled[-1] and (not self.turn_ends or self.turn_ends[-1] < last):
            self.turn_ends.append(last)
            self.turn_rewards.append(None)

    def record(self, step: EnvStep) -> None:
        if step.reward is not None and self.turn_rewards:  # summed: a turn without tokens adds to the last
            self.turn_rewards[-1] = (self.turn_rewards[-1] or 0.0) + float(step.reward)
        if step.reward is not None:
            self.reward = (self.reward or 0.0) + float(step.reward)
        self.tool_calls += step.tool_calls
        self.tool_errors += step.tool_errors


class MultiTurnSampler(Sampler):
    """Implements ``grpolab.rollout.base.Sampler`` for environment episodes, over an inner Sampler: it takes
    the examples (the environments are reset with them), hands the whole batch back at once, and has the
    inner sampler's weight versions."""

    takes_examples = True
    streams_groups = False

    def __init__(
        self,
        sampler: Sampler,
        tokenizer,
        make_env: Callable[[], Environment],
        *,
        max_turns: int,
        max_episode_tokens: int,
        step_timeout_s: float = 300.0,
        max_retries: int = 1,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        """``step_timeout_s``: the most an environment's step (and their closing) may take (env.step_timeout_s;
        envs.contract). ``max_retries``: how often a failed episode is run again (env.max_retries).
        ``template_kwargs``: what the chat template renders with (data.chat_template_kwargs)."""
        if max_turns < 1 or max_episode_tokens < 1 or max_retries < 0:
            raise ValueError(
                f"max_turns and max_episode_tokens must be >= 1 and max_retries >= 0, got {max_turns}, "
                f"{max_episode_tokens}, {max_retries}"
            )
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.make_env = make_env
        self.max_turns = max_turns
        self.max_episode_tokens = max_episode_tokens
        self.step_timeout_s = step_timeout_s
        self.max_retries = max_retries
        self.delta = ChatDelta(tokenizer, make_env().tools, template_kwargs)
        self.pad_token_id = sampler.pad_token_id
        self._device = torch.device("cpu")
        """Where the inner sampler's tensors live; the episode's tensors go there too."""

    @property
    def version(self) -> int | None:
        """The inner sampler's weight version (the server sampler's; None for an engine without versions)."""
        return self.sampler.version

    @property
    def last_sync_bytes(self) -> int:
        return self.sampler.last_sync_bytes

    def update_weights(self, model) -> None:
        """The inner engine takes the policy's weights (rollout.base.Sampler)."""
        self.sampler.update_weights(model)

    def send_pending(self) -> None:
        """The inner sampler's first weights, if it holds them back (the server sampler: rollout/vllm/client.py)."""
        self.sampler.send_pending()

    def take_part(self) -> None:
        """As a batch would: its first turn's collectives, inside ``awake`` (later turns run none: an engine held
        awake neither sleeps nor syncs between them, and FSDP2's layers stay gathered for the batch)."""
        with self.sampler.awake():
            self.sampler.take_part()

    def close(self) -> None:
        self.sampler.close()

    def sample(
        self,
        prompt_ids: list[list[int]],
        *,
        num_generations: int,
        generator: torch.Generator | None = None,
        examples: Sequence[Example] | None = None,
    ) -> Completions:
        """G episodes for each prompt, prompt-major. ``examples`` [P]: what each environment is reset with."""
        if examples is None or len(examples) != len(prompt_ids):
            raise ValueError(
                "a multi-turn sampler needs examples=[...], one per prompt, to reset the environments"
            )
        envs: list[Environment] = []  # every one made in this call (retries make more), each closed at its end
        episodes = [_Running(list(prompt), example) for prompt, example in zip(prompt_ids, examples, strict=True)
                    for _ in range(num_generations)]  # fmt: skip
        for e in episodes:
            self._begin(e, envs)  # reset here, outside any event loop, as before: it may run its own
        # one loop for the whole call (clients opened in a step stay usable), in its own thread, so that
        # every wait on the environments' steps is bounded (envs.contract)
        loop = EnvLoop(self.step_timeout_s)
        try:
            with self.sampler.awake():  # colocated vLLM: one sleep per batch
                self._turns(episodes, loop, generator, envs)
        finally:
            loop.close(_close_all(envs))
        return self._package(episodes, num_generations)

    def _begin(self, e: _Running, envs: list[Environment]) -> None:
        """Start episode ``e`` from a fresh environment; one that cannot be made or reset fails the attempt."""
        env = None
        try:
            env = self.make_env()
            envs.append(env)
            messages = checked_reset(env, env.reset(e.example))
        except Exception as exc:  # noqa: BLE001 - a custom environment's failure fails its episode only
            self._fail(e, env_failure(env, "reset(example)", exc), envs)
            return
        e.restart(env, messages)

    def _fail(self, e: _Running, failure: Failure, envs: list[Environment]) -> None:
        """Run episode ``e`` again from a fresh environment (max_retries), or fail it for good."""
        if e.retries >= self.max_retries:
            e.failure, e.finish = failure, "length"
            return
        e.retries += 1
        log.debug("episode run again (%d of %d): %s", e.retries, self.max_retries, failure.message)
        self._begin(e, envs)

    def _turns(self, episodes: list[_Running], loop: EnvLoop, generator, envs: list[Environment]) -> None:
        """Model turn, then environment turn, until every episode is done, failed or at max_turns (an episode run
        again counts its turns afresh)."""
        while running := [e for e in episodes if e.finish is None]:
            acting = self._model_turn(running, generator, envs)
            if not acting:
                continue
            try:
                steps = loop.run(_step_all(acting, self.step_timeout_s), f"step(model_turn) of {env_name(acting[0].env)}")
            except EnvTimedOut as err:  # the event loop is stuck: no episode can step in it again
                for e in episodes:
                    if e.finish is None:
                        e.failure, e.finish = Failure("env_timeout", one_line(err)), "length"
                return
            for e, step in zip(acting, steps, strict=True):
                if isinstance(step, Failure):
                    self._fail(e, step, envs)
                    continue
                e.record(step)
                if step.done:
                    e.finish = "stop"
                elif e.turns < self.max_turns:
                    self._env_turn(e, step.messages)
                else:
                    e.finish = "length"  # max_turns without the environment's done

    def _model_turn(self, running: list[_Running], generator, envs: list[Environment]) -> list[_Running]:
        """One model turn of every running episode; returns those that now wait for their environment."""
        out = self.sampler.sample([e.prompt + e.ids for e in running], num_generations=1, generator=generator)
        self._device = out.completion_ids.device
        lengths = out.lengths.tolist()
        ids, logprobs = out.completion_ids.tolist(), out.logprobs.float().tolist()
        failures = out.failures or [None] * len(running)
        acting = []
        for i, e in enumerate(running):
            if failures[i] is not None:  # the engine failed this turn (rollout.mode=server)
                self._fail(e, failures[i], envs)
                continue
            room = self.max_episode_tokens - len(e.ids)
            n = min(lengths[i], room)
            e.add(ids[i][:n], logprobs[i][:n])
            e.end_turn()
            text = self.tokenizer.decode(ids[i][:n], skip_special_tokens=True)
            e.messages.append({"role": "assistant", "content": text})
            if out.finish_reasons[i] == "length" or n < lengths[i]:
                e.finish = "length"  # the turn was cut: no complete action to answer
            else:
                acting.append(e)
        return acting

    def _env_turn(self, e: _Running, messages: list[Message]) -> None:
        ids = self.delta.ids(messages)
        e.messages.extend(dict(m) for m in messages)
        if len(e.ids) + len(ids) >= self.max_episode_tokens:  # no room left for a model token after it
            e.finish = "length"
            return
        e.add(ids, None)

    def _package(self, episodes: list[_Running], group: int) -> Completions:
        width = max(max(len(e.ids) for e in episodes), 1)
        n = len(episodes)
        ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.bool)
        sampled = torch.zeros((n, width), dtype=torch.bool)
        logprobs = torch.zeros((n, width), dtype=torch.float32)
        for i, e in enumerate(episodes):
            k = len(e.ids)
            ids[i, :k] = torch.tensor(e.ids, dtype=torch.long)
            mask[i, :k] = True
            sampled[i, :k] = torch.tensor(e.sampled, dtype=torch.bool)
            logprobs[i, :k] = torch.tensor(e.logprobs, dtype=torch.float32)
        ids, mask, sampled, logprobs = (x.to(self._device) for x in (ids, mask, sampled, logprobs))
        return Completions(
            prompt_ids=[e.prompt for e in episodes],
            completion_ids=ids,
            completion_mask=mask,
            logprobs=logprobs,
            texts=self.tokenizer.batch_decode([e.ids for e in episodes], skip_special_tokens=True),
            finish_reasons=[e.finish for e in episodes],
            num_generations=group,
            sampled_mask=sampled,
            episodes=[
                Episode(
                    tuple(e.messages), e.reward, e.turns, e.tool_calls, e.tool_errors,
                    tuple(e.turn_ends), tuple(e.turn_rewards), e.retries, getattr(e.env, "environment", None),
                )  # fmt: skip
                for e in episodes
            ],
            weight_versions=_versions(self.version, len(episodes)),
            failures=[e.failure for e in episodes] if any(e.failure for e in episodes) else None,
        )


def _versions(version: int | None, n: int) -> list[int] | None:
    """A server sampler's weight version (rollout/vllm/client.py) for every episode: a sync never falls
    inside a step's episodes (training/ahead.py), so all their turns share it; None for other engines."""
    return None if version is None else [int(version)] * n


async def _step_all(episodes: Sequence[_Running], timeout_s: float) -> list[EnvStep | Failure]:
    """Every episode's step on its last model turn, awaited together (async steps overlap); a step that fails
    is its episode's Failure (envs.contract.guarded_step)."""
    return list(await asyncio.gather(*(guarded_step(e.env, e.messages[-1]["content"], timeout_s) for e in episodes)))


async def _close_all(envs: Sequence[Environment]) -> None:
    """``close()`` on the environments that have one (a connection to an environment server); one that fails
    (its server already gone) is logged, and the others are still closed."""
    for env in envs:
        close = getattr(env, "close", None)
        if close is None:
            continue
        try:
            result = close()
            if inspect.isawaitable(result):
                await result
        except Exception as exc:  # noqa: BLE001 (closing what is already broken: nothing to lose)
            log.warning("closing environment %s failed (%s: %s); going on", env_name(env), type(exc).__name__, exc)


def episode_sampler(
    sampler, tokenizer, make_env: Callable[[], Environment] | None, env: EnvConfig, template_kwargs: Mapping[str, Any] | None = None
):
    """The sampler itself without an environment; else a MultiTurnSampler over it (``template_kwargs``:
    data.chat_template_kwargs)."""
    if make_env is None:
        return sampler
    return MultiTurnSampler(
        sampler, tokenizer, make_env, max_turns=env.max_turns, max_episode_tokens=env.max_episode_tokens,
        step_timeout_s=env.step_timeout_s, max_retries=env.max_retries, template_kwargs=template_kwargs,
    )
