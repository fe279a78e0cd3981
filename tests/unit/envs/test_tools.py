"""Tools: bounded failures (raise, hang, gigantic output), the calculator, call parsing, the tool env."""

from __future__ import annotations

import asyncio
import time

import pytest

from grpolab.envs import ToolLimits, build_environment, run_tool
from grpolab.envs.base import Tool
from grpolab.envs.tools import ToolEnv, calculator, numeric_match, parse_calls
from grpolab.errors import ConfigError
from grpolab.types import Example


def _tool(fn) -> Tool:
    return Tool(fn.__name__, fn, {"type": "function", "function": {"name": fn.__name__, "parameters": {}}})


def test_a_hanging_tool_is_cut_off_at_its_timeout():
    def hang(**_):
        time.sleep(30)

    async def hang_async(**_):
        await asyncio.sleep(30)

    for fn in (hang, hang_async):
        t0 = time.perf_counter()
        result = asyncio.run(run_tool(_tool(fn), {}, ToolLimits(timeout_s=0.3)))
        elapsed = time.perf_counter() - t0
        assert result.error == "timeout" and "timed out after 0.3 s" in result.text
        assert 0.3 <= elapsed < 15.0, elapsed  # cut off, not the 30 s the tool would take (bound loose for a loaded machine)


def test_a_raising_tool_gives_a_bounded_error_message():
    def boom(**_):
        raise RuntimeError("x" * 10_000)

    result = asyncio.run(run_tool(_tool(boom), {}, ToolLimits(max_output_chars=100)))
    assert result.error == "raised"
    assert result.text.startswith("error: RuntimeError: xxx") and len(result.text) == 100


def test_a_gigantic_output_is_cut_to_the_limit():
    def flood(**_):
        return "y" * 1_000_000

    result = asyncio.run(run_tool(_tool(flood), {}, ToolLimits(max_output_chars=50)))
    assert result.error == "too_long" and len(result.text) == 50 and result.text.endswith("chars]")
    assert "999950" in result.text  # says how much was cut


def test_unknown_tool_and_bad_arguments_are_messages():
    assert asyncio.run(run_tool(None, {}, ToolLimits())).error == "unknown_tool"
    calc = Tool.from_function(calculator)
    assert asyncio.run(run_tool(calc, {"nope": 1}, ToolLimits())).error == "bad_arguments"


def test_calculator():
    assert calculator("123*45") == "5535"
    assert calculator("(1+2)*3 - 4/2") == "7"
    assert calculator("7/2") == "3.5"
    with pytest.raises(ValueError):
        calculator("__import__('os')")
    with pytest.raises(ValueError):
        calculator("9**999999")


def test_calculator_schema_is_what_chat_templates_take():
    schema = Tool.from_function(calculator).schema
    assert schema["type"] == "function" and schema["function"]["name"] == "calculator"
    assert schema["function"]["parameters"]["required"] == ["expression"]


def test_parse_calls():
    hermes = 'a <tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>'
    assert parse_calls(hermes, "hermes") == [("calculator", {"expression": "2*3"})]
    assert parse_calls("the answer is 6", "hermes") is None
    bad = parse_calls("<tool_call>{not json}</tool_call>", "hermes")
    assert bad[0][0] == "" and bad[0][1].startswith("error:")
    assert parse_calls("calculator(12*3)", "python") == [("calculator", "12*3")]
    assert parse_calls("36", "python") is None


def test_tool_env_episode_and_on_error():
    example = Example("12*3=", "36")
    env = build_environment("calculator", {"call_format": "python"}, ToolLimits())()
    assert env.reset(example) == [{"role": "user", "content": "12*3="}]
    step = asyncio.run(env.step("calculator(12*3)"))
    assert step.messages == [{"role": "tool", "name": "calculator", "content": "36"}] and not step.done
    assert step.tool_calls == 1 and step.tool_errors == 0
    final = asyncio.run(env.step("36"))
    assert final.done and final.reward == 1.0
    strict = ToolEnv([Tool.from_function(calculator)], call_format="python", limits=ToolLimits(on_error="end"))
    strict.reset(example)
    ended = asyncio.run(strict.step("calculator(1/0)"))
    assert ended.done and ended.reward == 0.0 and ended.tool_errors == 1
    lenient = ToolEnv([Tool.from_function(calculator)], call_format="python")
    lenient.reset(example)
    goes_on = asyncio.run(lenient.step("calculator(1/0)"))
    assert not goes_on.done and "ZeroDivisionError" in goes_on.messages[0]["content"]


def test_numeric_match():
    assert numeric_match("so it is 5535", Example("", "5535")) == 1.0
    assert numeric_match("5534", Example("", "5535")) == 0.0
    assert numeric_match("no number", Example("", "5535")) == 0.0


def test_bad_env_config_is_one_line():
    with pytest.raises(ConfigError, match="unknown"):
        build_environment("nope", {}, ToolLimits())
    with pytest.raises(ConfigError, match="do not fit"):
        build_environment("calculator", {"colour": 1}, ToolLimits())


def test_python_tool_runs_in_the_sandbox():
    # a limit no sandbox start reaches on a loaded machine for the call that must answer; a short one for the loop
    env = build_environment("python", {"call_format": "hermes"}, ToolLimits(timeout_s=120))()
    env.reset(Example("q", "6"))
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(2*3)"}}</tool_call>'
    step = asyncio.run(env.step(call))
    assert step.messages[0]["content"].strip() == "6" and step.tool_errors == 0
    env = build_environment("python", {"call_format": "hermes"}, ToolLimits(timeout_s=2))()
    env.reset(Example("q", "6"))
    loop = '<tool_call>{"name": "python", "arguments": {"code": "while True: pass"}}</tool_call>'
    t0 = time.perf_counter()
    step = asyncio.run(env.step(loop))
    assert "killed" in step.messages[0]["content"] or "exit status" in step.messages[0]["content"]  # wall or CPU limit
    assert time.perf_counter() - t0 < 60  # cut off at its limit, not left running


def test_env_config_checks():
    from grpolab.config import load_config

    with pytest.raises(ConfigError, match="the steps of process supervision are the episode.s turns"):
        load_config(None, ["env.name=calculator", "algo.supervision=process", "reward.process={name: x}"])
    with pytest.raises(ConfigError, match="env.max_turns"):
        load_config(None, ["env.max_turns=0"])
    cfg = load_config(None, ["env.name=calculator", "env.kwargs={call_format: python}"])
    assert cfg.env.max_episode_tokens == 1024 and cfg.env.on_tool_error == "message"


def test_an_episode_budget_sets_the_length_limits():
    """With an environment a completion is a whole episode: env.max_episode_tokens, not one turn's
    rollout.max_completion_length, is the longest it can be (Dr. GRPO's normaliser, the context check,
    vLLM's max_model_len, where a turn's prompt is the episode so far)."""
    from types import SimpleNamespace

    from grpolab.config import load_config
    from grpolab.data import DataError
    from grpolab.rollout.vllm.setup import max_model_len
    from grpolab.runtime.engine_spec import engine_spec
    from grpolab.runtime.preflight import check_context
    from grpolab.runtime.step_spec import policy_loss_spec

    base = ["algo.name=dr_grpo", "rollout.max_completion_length=8", "data.max_prompt_length=16"]
    single = load_config(None, base)
    episodes = load_config(None, [*base, "env.name=calculator", "env.max_episode_tokens=40"])
    assert policy_loss_spec(single).aggregate.norm_len == 8
    assert policy_loss_spec(episodes).aggregate.norm_len == 40
    vllm = [*base, "rollout.engine=vllm"]  # the engine whose section sets max_model_len
    single_vllm = engine_spec(load_config(None, vllm))
    episodes_vllm = engine_spec(load_config(None, [*vllm, "env.name=calculator", "env.max_episode_tokens=40"]))
    assert max_model_len(single_vllm) == 16 + 8 and max_model_len(episodes_vllm) == 16 + 40 + 8
    learned_positions = SimpleNamespace(max_position_embeddings=48)  # no rope: past it is an error
    check_context(single, [[1] * 16], learned_positions)  # 16 + 8 fit
    with pytest.raises(DataError, match=r"\+ env.max_episode_tokens=40 = 56 tokens"):
        check_context(episodes, [[1] * 16], learned_positions)
