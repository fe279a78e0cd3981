"""TRL's ``tools`` and ``environment_factory`` given to GRPOTrainer run as grpolab episodes (grpolab.envs.trl_env):
hermes tool calls, the environment's methods as tools, reset(**row), get_reward, a dict of environments."""

from __future__ import annotations

import asyncio

import pytest

from grpolab.api import GRPOTrainer
from grpolab.envs import ENVIRONMENTS, ToolLimits
from grpolab.envs.trl_env import TrlEnvironment, env_reward, register, unregister
from grpolab.errors import ConfigError, RewardError
from grpolab.tasks.tiny import CHAT_TEMPLATE, build_char_tokenizer, build_tiny_model
from grpolab.types import Example


def multiply(a: int, b: int) -> int:
    """Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a * b


class Counter:
    """TRL's test environment: a counter the model increments with a tool; the reward is the count."""

    def reset(self, **kwargs):
        self.count = 0
        self.row = kwargs
        return " (count from 0)"

    def increment(self, step: int) -> int:
        """Increment the internal counter.

        Args:
            step: Value to add to the counter.
        """
        self.count += step
        return self.count

    def get_reward(self) -> float:
        return float(self.count)


class Echo:
    def reset(self, **kwargs):
        return None

    async def shout(self, text: str) -> str:
        """Shout the text back.

        Args:
            text: What to shout.
        """
        return text.upper()


def call(name: str, **arguments) -> str:
    import json

    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def env_for(tools=None, factory=None) -> TrlEnvironment:
    handle, _ = register(tools, factory)
    return TrlEnvironment(handle, ToolLimits())


def example(row: dict) -> Example:
    return Example(prompt="", messages=tuple(row["prompt"]), meta={"row": row})


ROW = {"prompt": [{"role": "user", "content": "Count"}], "solution": "3"}


def test_tools_are_declared_and_run_and_a_turn_without_a_call_ends_the_episode():
    env = env_for(tools=[multiply])
    assert [t["function"]["name"] for t in env.tools] == ["multiply"]
    assert env.reset(example(ROW)) == [{"role": "user", "content": "Count"}]
    step = asyncio.run(env.step(call("multiply", a=3, b=4) + call("multiply", a=3, c=4)))
    assert (step.tool_calls, step.tool_errors, step.done) == (2, 1, False)  # the wrong argument name fails
    assert step.messages[0] == {"role": "tool", "name": "multiply", "content": "12"}
    assert step.messages[1]["content"].startswith("error: ")
    last = asyncio.run(env.step("Done!"))
    assert (last.done, last.reward, last.messages) == (True, None, [])  # no get_reward: the rewards are reward_funcs'


def test_the_environment_is_reset_with_the_row_its_methods_are_tools_and_get_reward_reads_it():
    env = env_for(factory=Counter)
    assert [t["function"]["name"] for t in env.tools] == ["increment"]  # not reset, not get_reward
    messages = env.reset(example(ROW))
    assert messages == [{"role": "user", "content": "Count (count from 0)"}]  # reset's text, appended as TRL does
    assert env.environment.row == ROW
    step = asyncio.run(env.step(call("increment", step=2) + call("decrement", step=1)))
    assert (step.tool_calls, step.tool_errors) == (2, 1)  # an unknown tool is a failure the model reads
    assert step.messages[1]["content"] == "error: no such tool"
    assert asyncio.run(env.step(call("increment", step=1))).messages[0]["content"] == "3"
    assert asyncio.run(env.step("I am done")).reward is None  # the episode ends; its reward reads the object
    plain = Echo()
    assert env_reward(Counter)(environments=[env.environment, plain]) == [3.0, None]  # TRL's function
    assert env_reward(Counter).__name__ == "Counter"


def test_a_dict_of_factories_picks_each_row_s_environment_and_declares_every_tool():
    env = env_for(factory={"counter": Counter, "echo": Echo})
    assert sorted(t["function"]["name"] for t in env.tools) == ["increment", "shout"]
    env.reset(example({**ROW, "environment": "echo"}))
    assert isinstance(env.environment, Echo)
    assert asyncio.run(env.step(call("shout", text="hi"))).messages[0]["content"] == "HI"  # an async method
    assert asyncio.run(env.step("bye")).reward is None  # Echo has no get_reward
    with pytest.raises(ConfigError, match=r"environment='nope', which is not among .*\['counter', 'echo'\]"):
        env.reset(example({**ROW, "environment": "nope"}))


def test_an_environment_without_reset_and_a_handle_of_no_trainer_are_one_line_each():
    with pytest.raises(ConfigError, match="made a object without a reset method"):
        register(None, object)
    with pytest.raises(ConfigError, match="names no tools or environment_factory of this process"):
        ENVIRONMENTS["trl"](ToolLimits(), "gone")()
    handle, _ = register([multiply], None)
    unregister(handle)
    with pytest.raises(ConfigError, match="names no tools"):
        TrlEnvironment(handle)


ROWS = [{"prompt": [{"role": "user", "content": f"{a}+{b}="}], "solution": str(a + b)} for a in range(2) for b in range(2)]


def one_per_char(completions, **kwargs):
    return [float(len(c[-1]["content"])) for c in completions]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> str:
    """The tiny model with a chat template its character vocabulary can spell (conversational rows need one)."""
    tok = build_char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    path = tmp_path_factory.mktemp("chat_tiny")
    build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _args(out) -> dict:
    return {
        "rollout": {"num_generations": 2, "max_completion_length": 3},
        "train": {"num_steps": 1, "prompts_per_step": 2},
        "log": {"output_dir": str(out), "run_name": "tools", "progress": False, "checkpoint_every": 0},
        "reward": {"dry_run_examples": 1},
    }


def test_the_trainer_runs_environment_factory_as_episodes(chat_model, tmp_path):
    trainer = GRPOTrainer(chat_model, one_per_char, _args(tmp_path), ROWS, environment_factory=Echo, tools=[multiply])
    assert (trainer.args.env.name, trainer.reward_func_names) == ("trl", ["one_per_char"])
    trainer.train()
    row = trainer.state.log_history[0]
    assert row["num_turns/mean"] == 1.0  # the tiny model makes no call: its turn is cut at 3 tokens
    assert row["tools/call_frequency"] == 0.0


def test_get_reward_is_a_reward_of_weight_one_and_no_reward_at_all_is_one_line(chat_model, tmp_path):
    trainer = GRPOTrainer(chat_model, one_per_char, _args(tmp_path), ROWS, environment_factory=Counter,
                          reward_weights=[0.5])  # fmt: skip
    assert trainer.reward_func_names == ["one_per_char", "Counter"]  # named after the class, as TRL names it
    assert trainer.reward_weights.tolist() == [0.5, 1.0]
    assert trainer.args.reward.functions[1].name == "test_api_tools:Counter.get_reward"  # config.yaml: what it calls
    assert [t.__name__ for t in trainer.tools] == ["increment"]  # TRL's trainer.tools: no reset, no get_reward
    # TRL's trainer.reward_funcs: the function given, then the environment's reward, a function of environments
    assert trainer.reward_funcs[0] is one_per_char and len(trainer.reward_funcs) == 2
    counted, other = Counter(), Counter()
    counted.reset(), other.reset()
    counted.increment(3)
    assert trainer.reward_funcs[-1](environments=[counted, other, Echo()]) == [3.0, 0.0, None]  # not a Counter: None
    assert GRPOTrainer(chat_model, None, _args(tmp_path), ROWS, environment_factory=Counter).reward_func_names == ["Counter"]
    # two classes own a reward: one column per class, as in TRL (a class under two names: one), and both classes' tools
    class Other(Counter):
        def decrement(self, step: int) -> int:
            """Decrement the internal counter.

            Args:
                step: Value to take from the counter.
            """
            self.count -= step
            return self.count

    both = GRPOTrainer(chat_model, None, _args(tmp_path), [{**ROW, "environment": "c"}], tools=[multiply],
                       environment_factory={"c": Counter, "o": Other, "again": Counter})  # fmt: skip
    assert both.reward_func_names == ["Counter", "Other"]
    assert [t.__name__ for t in both.tools] == ["multiply", "increment", "decrement"]
    with pytest.raises(ConfigError, match="No reward source provided: pass reward_funcs"):
        GRPOTrainer(chat_model, args=_args(tmp_path), train_dataset=ROWS, tools=[multiply])


def test_without_a_train_dataset_the_environment_owns_the_data(chat_model, tmp_path):
    # TRL: reset() returns each prompt, appended to an empty user turn; train.prompts_per_step such rows
    trainer = GRPOTrainer(chat_model, one_per_char, _args(tmp_path), environment_factory=Counter)
    assert [e.messages for e in trainer.train_dataset] == [({"role": "user", "content": ""},)] * 2
    env = TrlEnvironment(trainer.args.env.kwargs["handle"], ToolLimits())
    assert env.reset(trainer.train_dataset[0]) == [{"role": "user", "content": " (count from 0)"}]
    # a dict of factories routes each row by its environment column: it needs a dataset, whose rows may hold no prompt
    with pytest.raises(ValueError, match="requires a `train_dataset` with an `environment` column"):
        GRPOTrainer(chat_model, one_per_char, _args(tmp_path), environment_factory={"c": Counter, "e": Echo})
    routed = GRPOTrainer(chat_model, one_per_char, _args(tmp_path), [{"environment": "c"}, {"environment": "e"}],
                         environment_factory={"c": Counter, "e": Echo})  # fmt: skip
    assert [e.messages for e in routed.train_dataset] == [({"role": "user", "content": ""},)] * 2


def test_a_trl_config_without_a_train_dataset_needs_max_steps(chat_model, tmp_path):
    trl = pytest.importorskip("trl")
    with pytest.raises(ConfigError, match="needs `max_steps` > 0"):
        GRPOTrainer(chat_model, one_per_char, trl.GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True),
                    environment_factory=Counter)  # fmt: skip


class Keeper:
    """Keeps its row's solution at reset; its tool counts the calls made to it."""

    def reset(self, **row):
        self.solution, self.calls = row["solution"], 0

    def note(self, text: str) -> str:
        """Note a text.

        Args:
            text: What to note.
        """
        self.calls += 1
        return text

    async def get_reward(self) -> float:  # TRL awaits an async one too
        return 2.0 + self.calls


SEEN: list[list] = []


def own_row(environments, solution, **kwargs):
    """TRL's environments: each completion's object, in completion order, as reset with its row (no call made)."""
    SEEN.append(environments)
    return [float(env.solution == s) + 10 * env.calls for env, s in zip(environments, solution, strict=True)]


def test_a_reward_reads_each_completion_s_environment_in_this_process(chat_model, tmp_path):
    SEEN.clear()
    trainer = GRPOTrainer(chat_model, own_row, _args(tmp_path), ROWS, environment_factory=Keeper)
    trainer.train()
    assert trainer.reward_func_names == ["own_row", "Keeper"]
    row = trainer.state.log_history[0]
    assert (row["rewards/own_row/mean"], row["rewards/Keeper/mean"]) == (1.0, 2.0)  # each its own row's, none called
    # recorded here: the reward ran in the trainer process, where the objects are; the dry run (dry_run_examples 1:
    # the reference answer and an empty one, each alone) gives each a fresh object reset with its row
    assert [len(s) for s in SEEN] == [1, 1, 4] and all(type(e) is Keeper for s in SEEN for e in s)
    step = SEEN[-1]
    assert len({id(e) for e in step}) == 4
    assert [e.solution for e in step[::2]] == [e.solution for e in step[1::2]]  # a prompt's two completions
    # a reward that needs environments in a run without environment_factory: one line, before training
    with pytest.raises(RewardError, match=r"reward 'own_row' needs \['environments'\].*environment_factory"):
        GRPOTrainer(chat_model, own_row, _args(tmp_path / "none"), ROWS).train()
