"""TRL's ``tools`` and ``environment_factory`` (GRPOTrainer's arguments) as a grpolab Environment.

TRL 1.16 (``GRPOTrainer._tool_call_loop``): the model's turn is parsed for tool calls; each call runs, its
result goes back as a ``role: "tool"`` message, and the model goes on until a turn makes no call (or
``max_tool_calling_iterations``). With ``environment_factory``, one environment object per rollout:
``reset(**row)`` is called before generation (a string it returns is appended to the last user message),
its public methods (not ``reset`` / ``get_reward``, no leading ``_``) are tools beside ``tools``, and each class
that defines ``get_reward()`` adds one reward function, named after the class (weight 1): ``get_reward(environments,
**kwargs)``, each rollout's ``get_reward()`` where its environment is exactly that class, else None. A dict of
factories picks one per row by the row's ``environment`` column.

grpolab runs that as an episode (docs/multiturn.md): ``TrlEnvironment`` reads hermes calls
(``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, what the chat templates TRL supports write)
with ``envs.tools.parse_calls`` and runs them with ``envs.base.run_tool`` (bounded, a failure is the
model's to read). The objects live in this process: ``register`` keeps them under a handle that
``env.kwargs.handle`` names, so the run's config.yaml says which environment class ran, not how to rerun it.
Each episode's object stays with it (``Episode.environment``): TRL-style rewards read them as ``environments``
(rewards/trl_style.py).
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grpolab.envs.base import EnvStep, Message, Tool, ToolLimits, run_tool
from grpolab.envs.tools import parse_calls
from grpolab.errors import ConfigError
from grpolab.types import Example

_NOT_TOOLS = ("reset", "get_reward")


@dataclass(frozen=True)
class TrlTools:
    """What a GRPOTrainer was given: standalone tools and the environment factories by name."""

    tools: tuple[Callable[..., Any], ...]
    """TRL's ``tools``: functions (sync or async) declared to the model by signature and docstring."""
    factories: Mapping[str | None, Callable[[], Any]]
    """``{None: factory}`` for one ``environment_factory``, ``{name: factory}`` for a dict; empty for none."""
    rewarded: tuple[type, ...]
    """The environment classes that define ``get_reward``, in the order first made (one reward each: ``env_reward``)."""


_REGISTERED: dict[str, TrlTools] = {}


def env_methods(instance: Any) -> list[Callable[..., Any]]:
    """An environment object's tools: its public functions but reset and get_reward (listed on the class, as TRL
    does, so that properties are not evaluated)."""
    return [
        getattr(instance, name)
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if name not in _NOT_TOOLS and not name.startswith("_")
    ]


def register(tools: Sequence[Callable[..., Any]] | None, environment_factory: Any) -> tuple[str, TrlTools]:
    """Check TRL's arguments as TRL does (each factory makes an object with ``reset``) and keep them under a new
    handle for ``TrlEnvironment(handle)``."""
    if environment_factory is None:
        factories: dict[str | None, Callable[[], Any]] = {}
    elif isinstance(environment_factory, Mapping):
        factories = dict(environment_factory)
    else:
        factories = {None: environment_factory}
    rewarded: list[type] = []
    for name, factory in factories.items():
        probe = factory()
        if not callable(getattr(probe, "reset", None)):
            raise ConfigError(
                f"environment_factory{'' if name is None else f'[{name!r}]'} made a {type(probe).__name__} without a "
                "reset method: each environment defines reset(**row) (returning None or text for the prompt)"
            )
        if callable(getattr(probe, "get_reward", None)) and type(probe) not in rewarded:
            rewarded.append(type(probe))
    for fn in list(tools or []):
        if not callable(fn):
            raise ConfigError(f"tools: {fn!r} is not a function; give Python functions with Google-style docstrings")
    handle = uuid.uuid4().hex
    _REGISTERED[handle] = spec = TrlTools(tuple(tools or ()), factories, tuple(rewarded))
    return handle, spec


def unregister(handle: str) -> None:
    """Forget a handle (the trainer that registered it is gone)."""
    _REGISTERED.pop(handle, None)


class TrlEnvironment:
    """Implements ``grpolab.envs.Environment`` for one TRL rollout (module docstring)."""

    def __init__(self, handle: str, limits: ToolLimits | None = None) -> None:
        spec = _REGISTERED.get(handle)
        if spec is None:
            raise ConfigError(
                f"env.kwargs.handle={handle!r} names no tools or environment_factory of this process: they are "
                "Python objects given to grpolab.GRPOTrainer, which exist only while it does (run it from Python)"
            )
        self.spec = spec
        self.limits = limits or ToolLimits()
        # The declared tools: the standalone ones and every environment's methods (an environment made here only to
        # read them); the episode's own environment is made at reset, from the row.
        probes = [factory() for factory in spec.factories.values()]
        self.tools = [Tool.from_function(fn).schema for fn in _unique([*spec.tools, *_all_methods(probes)])]
        self.environment: Any = None
        """This episode's environment object once reset (None without environment_factory): ``Episode.environment``."""
        self.offers_environment = bool(spec.factories)
        """Whether each episode has an environment object: TRL then passes ``environments`` to every reward."""
        self._by_name: dict[str, Tool] = {}

    def reset(self, example: Example) -> list[Message]:
        row = dict(example.meta.get("row") or {})
        name = row.get("environment") if None not in self.spec.factories else None
        if self.spec.factories and name not in self.spec.factories:
            raise ConfigError(
                f"the row has environment={name!r}, which is not among the environments passed to "
                f"environment_factory: {sorted(map(str, self.spec.factories))}"
            )
        methods: list[Callable[..., Any]] = []
        if self.spec.factories:
            self.environment = self.spec.factories[name]()
            kwargs = {k: v for k, v in row.items() if k != "environment"} if name is not None else row
            observation = self.environment.reset(**kwargs)
            methods = env_methods(self.environment)
        else:
            observation = None
        self._by_name = {t.name: t for t in map(Tool.from_function, [*self.spec.tools, *methods])}
        messages = [dict(m) for m in example.messages] if example.messages else [{"role": "user", "content": example.prompt}]
        if isinstance(observation, str):  # TRL: appended to the last user message
            messages[-1] = {**messages[-1], "content": f"{messages[-1]['content']}{observation}"}
        return messages

    async def step(self, model_turn: str) -> EnvStep:
        calls = parse_calls(model_turn, "hermes")
        if calls is None:  # a turn without a call ends the rollout (its reward reads the object: env_reward)
            return EnvStep(done=True)
        messages, errors = [], 0
        for name, arguments in calls:
            if not name:  # a call that is not JSON with a name and arguments
                text, failed = str(arguments), True
            else:
                result = await run_tool(self._by_name.get(name), arguments, self.limits)
                text, failed = result.text, result.error is not None
            errors += failed
            messages.append({"role": "tool", "name": name or "error", "content": text})
        return EnvStep(messages, tool_calls=len(messages), tool_errors=errors)


def env_reward(env_type: type) -> Callable[..., Any]:
    """TRL's reward function for an environment class that owns its reward: ``get_reward(environments, **kwargs)``,
    each environment's ``get_reward()`` (awaited when async) where it is exactly ``env_type`` (as TRL matches: a
    subclass is not scored twice), else None; all None where there are no environments (single turns: TRL requires
    them). Named after the class, as TRL names its reward column."""
    if inspect.iscoroutinefunction(env_type.get_reward):

        async def get_reward(environments=None, completions=(), **kwargs):
            if environments is None:  # single turns (GRPOTrainer.evaluate): no environment to ask
                return [None] * len(completions)
            return [await e.get_reward() if type(e) is env_type else None for e in environments]

    else:

        def get_reward(environments=None, completions=(), **kwargs):
            if environments is None:
                return [None] * len(completions)
            return [e.get_reward() if type(e) is env_type else None for e in environments]

    get_reward.__name__ = env_type.__name__
    get_reward.__qualname__ = f"{env_type.__qualname__}.get_reward"  # config.yaml: the method it calls
    get_reward.__module__ = env_type.__module__
    return get_reward


def _all_methods(instances: Sequence[Any]) -> list[Callable[..., Any]]:
    return [m for instance in instances for m in env_methods(instance)]


def _unique(fns: Sequence[Callable[..., Any]]) -> list[Callable[..., Any]]:
    """One function per tool name (two environments of one class declare its methods once)."""
    seen: dict[str, Callable[..., Any]] = {}
    for fn in fns:
        seen.setdefault(fn.__name__, fn)
    return list(seen.values())
