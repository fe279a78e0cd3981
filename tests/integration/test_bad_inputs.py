"""Bad input, one table: each case stops with a message naming the file, row or key and the fix.

Cases marked early must fail before the policy model is loaded (no compute spent). The same errors
reach the command line as one line, ``grpolab: error: ...``, with exit status 2.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import grpolab.train.loop as loop
from grpolab.cli import main
from grpolab.config import ConfigError, load_config
from grpolab.data import DataError
from grpolab.errors import GrpolabError
from grpolab.models import ModelLoadError, load_tokenizer
from grpolab.rewards import REWARDS, RewardError, build_reward, score_batch
from grpolab.tasks.arithmetic import arithmetic_examples
from grpolab.tasks.tiny import build_char_tokenizer
from grpolab.types import Completion, Example

ROWS = [{"prompt": e.prompt, "answer": e.answer} for e in arithmetic_examples(size=8, seed=0, digits=1)]


def jsonl(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


@dataclass
class Case:
    overrides: list[str]
    message: str
    error: type[GrpolabError]
    early: bool = True
    """Must fail before the policy loads."""
    files: dict[str, str] = field(default_factory=dict)
    """Written under the test's folder ({tmp}) first; config.yaml is passed as --config."""


CASES = {
    "malformed YAML": Case([], "config.yaml is not valid YAML", ConfigError, files={"config.yaml": "model: [oops\n"}),
    "YAML not a mapping": Case([], "the top level must be a mapping", ConfigError, files={"config.yaml": "- a\n"}),
    "unknown key": Case(["train.num_step=3"], "'train.num_step'; did you mean 'train.num_steps'?", ConfigError),
    "mistyped value": Case(["train.num_steps=ten"], "'train.num_steps' must be int, got 'ten'", ConfigError),
    "unknown choice": Case(["algo.name=grpoo"], "did you mean 'grpo'?", ConfigError),
    "one completion per group": Case(["rollout.num_generations=1"], "needs at least 2 per prompt", ConfigError),
    "groups split by minibatches": Case(["algo.num_minibatches=3"], "divisible by algo.num_minibatches", ConfigError),
    "negative max_bad_steps": Case(["train.max_bad_steps=-1"], "train.max_bad_steps must be >= 0", ConfigError),
    "negative checkpoint_every": Case(["log.checkpoint_every=-2"], "log.checkpoint_every must be >= 0", ConfigError),
    "missing model path": Case(
        ["model.name_or_path=/nonexistent/tiny"], "model.name_or_path: /nonexistent/tiny does not exist", ModelLoadError
    ),
    "model folder without config.json": Case(
        ["model.name_or_path={tmp}/empty"], "is a folder without config.json", ModelLoadError, files={"empty/x": ""}
    ),
    "missing dataset": Case(["data.path={tmp}/none.jsonl"], "data.path: {tmp}/none.jsonl does not exist", DataError),
    "invalid JSON line": Case(
        ["data.path={tmp}/d.jsonl"], "d.jsonl:2 is not valid JSON", DataError, files={"d.jsonl": jsonl(ROWS[:1]) + "{\n"}
    ),
    "row without the prompt": Case(
        ["data.path={tmp}/d.jsonl"],
        "d.jsonl row 2 has no field 'prompt' (data.prompt_field); its fields are ['answer', 'question']",
        DataError,
        files={"d.jsonl": jsonl([ROWS[0], {"question": "1+1", "answer": "2"}])},
    ),
    "row without the answer": Case(
        ["data.path={tmp}/d.jsonl"], "Set data.answer_field=null", DataError, files={"d.jsonl": jsonl([{"prompt": "1+1"}])}
    ),
    "empty dataset": Case(["data.path={tmp}/d.jsonl"], "d.jsonl holds no rows", DataError, files={"d.jsonl": "\n"}),
    "no training rows left": Case(["data.eval_size=8"], "data.eval_size=8 leaves no training examples", DataError),
    "prompt over max_prompt_length": Case(
        ["data.max_prompt_length=3"], "over data.max_prompt_length=3", DataError, early=False
    ),
    "beyond the learned positions": Case(
        ["model.name_or_path={gpt2}", "rollout.max_completion_length=40"],
        "+ rollout.max_completion_length=40 = ",
        DataError,
        early=False,
    ),
    "no reward": Case(["reward.functions=[]"], "reward.functions is empty", ConfigError),
    "unknown reward": Case(
        ["reward.functions=[{name: exact_mtch}]"], "reward.functions[0] (name 'exact_mtch'): unknown", ConfigError
    ),
    "reward kwargs": Case(
        ["reward.functions=[{name: exact_match, kwargs: {mode: x}}]"], "does not accept kwargs", ConfigError
    ),
    "reward raises": Case(
        ["reward.functions=[{name: 'bad_rewards:raises'}]"], "raised ZeroDivisionError on example 0", RewardError
    ),
    "reward returns NaN": Case(
        ["reward.functions=[{name: 'bad_rewards:nan'}]"], "returned nan for example 0", RewardError
    ),
    "reward returns text": Case(
        ["reward.functions=[{name: 'bad_rewards:text'}]"], "returned '1.0' (str) for example 0", RewardError
    ),
    "reward wrong count": Case(
        ["reward.functions=[{name: 'bad_rewards:wrong_count'}]"], "returned 2 values for 1 completions", RewardError
    ),
    "reward too slow": Case(
        ["reward.functions=[{name: 'bad_rewards:slow'}]", "reward.timeout_s=0.2"], "took longer than 0.2 s", RewardError
    ),
    "code reward without tests": Case(
        ["reward.functions=[{name: code_tests}]"], "on example 0 (prompt: '6+6='): the example has no 'tests'", RewardError
    ),
    "fresh run over checkpoints": Case(
        [], "already holds checkpoints (up to step_3). Pass --resume", ConfigError,
        files={"runs/bad/checkpoints/step_3/trainer_state.pt": ""},
    ),
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "add.jsonl"
    path.write_text(jsonl(ROWS))
    return path


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> str:
    """A tiny GPT-2 (learned positions, 32 of them): generating past them fails, so the check must."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = build_char_tokenizer()
    config = GPT2Config(vocab_size=len(tok), n_positions=32, n_embd=16, n_layer=1, n_head=2)
    path = tmp_path_factory.mktemp("gpt2")
    GPT2LMHeadModel(config).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def base_overrides(model_dir, dataset, tmp) -> list[str]:
    return [
        f"model.name_or_path={model_dir}",
        f"data.path={dataset}",
        "reward.functions=[{name: exact_match}]",
        "rollout.num_generations=2",
        "rollout.max_completion_length=4",
        "train.prompts_per_step=2",
        "train.num_steps=1",
        f"log.output_dir={tmp}/runs",
        "log.run_name=bad",
        "log.progress=false",
        "log.tensorboard=false",
    ]


def setup_case(case: Case, tmp: Path, tiny_model_dir, dataset, gpt2_dir) -> tuple[str | None, list[str], str]:
    for name, content in case.files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(content)

    def fill(text: str) -> str:
        return text.replace("{tmp}", str(tmp)).replace("{gpt2}", gpt2_dir)

    overrides = base_overrides(tiny_model_dir, dataset, tmp) + [fill(o) for o in case.overrides]
    config = str(tmp / "config.yaml") if "config.yaml" in case.files else None
    return config, overrides, fill(case.message)


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_stops_with_a_message_that_says_how_to_fix_it(
    name, tmp_path, tiny_model_dir, dataset, gpt2_dir, monkeypatch
):
    case = CASES[name]
    config, overrides, message = setup_case(case, tmp_path, tiny_model_dir, dataset, gpt2_dir)
    if case.early:

        def no_model(*args, **kwargs):
            raise AssertionError("the policy was loaded before the bad input was found")

        monkeypatch.setattr(loop, "load_policy", no_model)
    with pytest.raises(case.error) as err:
        loop.train(load_config(config, overrides))
    assert message in str(err.value)


@pytest.mark.parametrize("name", ["unknown key", "missing model path", "row without the prompt", "reward raises"])
def test_the_cli_prints_one_line_and_exits_2(name, tmp_path, tiny_model_dir, dataset, gpt2_dir, capsys):
    config, overrides, message = setup_case(CASES[name], tmp_path, tiny_model_dir, dataset, gpt2_dir)
    code = main(["--log-level", "ERROR", "train", *(["--config", config] if config else []), *overrides])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("grpolab: error: ") and "\n" not in err and message in err


def test_an_unknown_error_keeps_its_traceback(monkeypatch, tmp_path):
    def broken(cfg, *, resume=False):
        raise RuntimeError("a bug")

    monkeypatch.setattr(loop, "train", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["train", f"log.output_dir={tmp_path}"])


def test_cli_subprocess_config_error_has_no_traceback():
    done = subprocess.run(
        [sys.executable, "-m", "grpolab", "config", "algo.nme=grpo"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "grpolab: error: unknown config key 'algo.nme'; did you mean 'algo.name'?"


def test_rotary_model_past_its_positions_warns(tiny_model_dir, dataset, tmp_path, caplog, monkeypatch):
    cfg = load_config(None, [*base_overrides(tiny_model_dir, dataset, tmp_path), "rollout.max_completion_length=300"])

    def stop_here(*args, **kwargs):
        raise AssertionError("stop here")

    monkeypatch.setattr(loop, "sampler_from_config", stop_here)  # the check has run by then: no need to train
    with caplog.at_level(logging.WARNING), pytest.raises(AssertionError, match="stop here"):
        loop.train(cfg)
    assert "beyond the model's max_position_embeddings=256" in caplog.text
    assert "a rotary model runs past it" in caplog.text


def test_a_tokenizer_without_pad_token_pads_with_eos(tiny_model_dir, tmp_path, caplog):
    from grpolab.config import ModelConfig

    tok = build_char_tokenizer()
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING):
        loaded = load_tokenizer(ModelConfig(name_or_path=tiny_model_dir, tokenizer=str(tmp_path)))
    assert loaded.pad_token == loaded.eos_token == "<eos>"
    assert "has no pad token: using its EOS token for padding" in caplog.text


def test_empty_completions_reach_every_rule_reward_without_crashing():
    kwargs = {
        "soft_overlong": {"max_length": 8, "cache_length": 4},
        "length_penalty": {"coef": 0.1, "max_length": 8},
        "code_tests": {"timeout_s": 2.0},
    }
    skip = {"reward_model", "reasoning_gym"}  # need a model folder / a gym entry: covered in their own tests
    rewards = [build_reward(name, kwargs=kwargs.get(name)) for name in REWARDS if name not in skip]
    example = Example("1+1=", answer="2", meta={"tests": ["assert True"]})
    empty = [Completion("", 1), Completion("", 0, "length")]
    result = score_batch(rewards, empty, [example] * 2, timeout_s=30)
    assert all(v is None or v == v for values in result.components.values() for v in values)
    assert result.components["code_tests"] == [0.0, 0.0]
