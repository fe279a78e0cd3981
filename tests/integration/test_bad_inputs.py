"""Bad input, one table: each case stops with a message naming the file, row or key and the fix.

Cases marked early must fail before the policy model is loaded (no compute spent). The same errors
reach the command line as one line, ``grpolab: error: ...``, with exit status 2.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

import grpolab.commands.eval as eval_command
import grpolab.commands.sft as sft_mod
import grpolab.commands.train as loop
import grpolab.runtime.assemble as assemble_mod
from grpolab.cli import main
from grpolab.config import ConfigError, load_config
from grpolab.data import DataError
from grpolab.errors import GrpolabError, TrainingError
from grpolab.models.loading import ModelLoadError, load_tokenizer
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
    files: dict[str, str | bytes] = field(default_factory=dict)
    """Written under the test's folder ({tmp}) first (after from_run's copy); a config.yaml path is passed as
    --config."""
    verb: str = "train"
    """train, resume (train --resume), sft or eval."""
    from_run: bool = False
    """Start from a copy of a real one-step run (checkpoints/step_1) in {tmp}/runs/bad."""
    kept: str | None = None
    """A file under {tmp} that must still exist after the error (nothing deleted before the checks)."""


BAD_UTF8 = b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": "caf\xe9", "answer": "2"}\n'
CKPT = "runs/bad/checkpoints"


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
    "hub id not cached, offline": Case(
        ["model.name_or_path=nobody/not-a-cached-model"],
        "model.name_or_path 'nobody/not-a-cached-model' is not a local folder and not in the Hugging Face cache, "
        "and HF_HUB_OFFLINE=1",
        GrpolabError,
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
    "row without the answer, a reward needs it": Case(
        ["data.path={tmp}/d.jsonl"],
        "the dataset row has no 'answer' field (data.answer_field), which reward 'exact_match' needs",
        RewardError,
        files={"d.jsonl": jsonl([{"prompt": "1+1"}])},
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
    "reward swallows the timeout": Case(
        ["reward.functions=[{name: 'bad_rewards:swallows_timeout'}]", "reward.timeout_s=0.5"],
        "reward 'swallows_timeout' took longer than 0.5 s", RewardError,
    ),
    "reward stuck in a C regex": Case(
        ["reward.functions=[{name: 'bad_rewards:catastrophic_regex'}]", "reward.timeout_s=0.5"],
        "reward 'catastrophic_regex' took longer than 0.5 s", RewardError,
    ),
    "code reward without tests": Case(
        ["reward.functions=[{name: code_tests}]"], "on example 0 (prompt: '6+6='): the example has no 'tests'", RewardError
    ),
    "fresh run over checkpoints": Case(
        [], "already holds checkpoints (up to step_3). Pass --resume", ConfigError,
        files={"runs/bad/checkpoints/step_3/trainer_state.pt": ""},
    ),
    "duplicate YAML section": Case(
        [], "config.yaml:3: key 'algo' is given twice (first on line 1)", ConfigError,
        files={"config.yaml": "algo:\n  beta: 0.1\nalgo:\n  mu: 2\n"},
    ),
    "duplicate YAML key in a section": Case(
        [], "config.yaml:3: key 'beta' is given twice (first on line 2)", ConfigError,
        files={"config.yaml": "algo:\n  beta: 0.1\n  beta: 0.2\n"},
    ),
    "unknown key in the config file": Case(
        [], "config.yaml:3: unknown config key 'train.num_step'; did you mean", ConfigError,
        files={"config.yaml": "algo:\n  beta: 0.1\ntrain: {num_step: 3}\n"},
    ),
    "config number out of range, by line": Case(
        [], "config.yaml:4: config key 'optim.betas[1]' is inf", ConfigError,
        files={"config.yaml": "optim:\n  betas:\n    - 0.9\n    - .inf\n"},
    ),
    "duplicate key in an override": Case(
        ["reward.functions=[{name: exact_match, name: r1_format}]"], "key 'name' is given twice", ConfigError
    ),
    "config not UTF-8": Case(
        [], "config.yaml:2 is not UTF-8 text", ConfigError, files={"config.yaml": b"algo:\n  name: gr\xffpo\n"}
    ),
    "config is a folder": Case([], "config.yaml is a folder; give the YAML file itself", ConfigError,
                               files={"config.yaml/x": ""}),
    "lr NaN": Case(["optim.lr=nan"], "config key 'optim.lr' is nan; give a finite number", ConfigError),
    "temperature NaN": Case(["rollout.temperature=.nan"], "config key 'rollout.temperature' is nan", ConfigError),
    "beta NaN": Case(["algo.beta=nan"], "config key 'algo.beta' is nan", ConfigError),
    "clip infinite": Case(["algo.clip_low=inf"], "config key 'algo.clip_low' is inf", ConfigError),
    "reward weight NaN": Case(
        ["reward.functions=[{name: exact_match, weight: .nan}]"], "'reward.functions[0].weight' is nan", ConfigError
    ),
    "greedy groups": Case(["rollout.temperature=0"], "rollout.temperature=0 samples greedily", ConfigError),
    "unknown template": Case(["data.template=r2"], "data.template: template 'r2' is neither one of", ConfigError),
    "betas out of range": Case(["optim.betas=[0.9, 1.5]"], "optim.betas must both be in [0, 1)", ConfigError),
    "negative weight decay": Case(["optim.weight_decay=-0.1"], "optim.weight_decay must be >= 0", ConfigError),
    "zero eps": Case(["algo.eps=0"], "algo.eps must be > 0", ConfigError),
    "LoRA dropout 1": Case(["model.lora.dropout=1.0"], "model.lora.dropout must be in [0, 1)", ConfigError),
    "negative eval_size": Case(["data.eval_size=-1"], "data.eval_size must be >= 0", ConfigError),
    "zero max_batch_sequences": Case(["rollout.max_batch_sequences=0"], "rollout.max_batch_sequences must be >= 1",
                                     ConfigError),
    "negative max_no_signal_steps": Case(["train.max_no_signal_steps=-1"], "train.max_no_signal_steps must be >= 0",
                                         ConfigError),
    "negative warmup": Case(["optim.warmup_steps=-5"], "optim.warmup_steps must be >= 0", ConfigError),
    "negative eval temperature": Case(["eval.temperature=-1"], "eval.temperature must be >= 0", ConfigError),
    "cuda without CUDA": Case(["model.device=cuda"], "model.device=cuda but torch sees no CUDA device", ConfigError),
    "two rewards of one name": Case(
        ["reward.functions=[{name: exact_match}, {name: exact_match, kwargs: {extract: last_line}}]"],
        "reward.functions[0] and reward.functions[1] are both named 'exact_match'; give one an alias, "
        "e.g. reward.functions[1].alias=exact_match_2",
        ConfigError,
    ),
    "two aliases alike": Case(
        ["reward.functions=[{name: exact_match, alias: a}, {name: r1_format, alias: a}]"],
        "are both named 'a'",
        ConfigError,
    ),
    "output folder is a file": Case(
        ["log.output_dir={tmp}/taken"], "log.output_dir: cannot write the run directory {tmp}/taken/bad", ConfigError,
        files={"taken": "a file"},
    ),
    "dataset not UTF-8": Case(["data.path={tmp}/d.jsonl"], "d.jsonl:2 is not UTF-8 text", DataError,
                              files={"d.jsonl": BAD_UTF8}),
    "dataset is a folder": Case(["data.path={tmp}/dd"], "data.path: {tmp}/dd is a folder", DataError,
                                files={"dd/x": ""}),
    "null prompt": Case(
        ["data.path={tmp}/d.jsonl"], "d.jsonl row 2: field 'prompt' (data.prompt_field) is null", DataError,
        files={"d.jsonl": jsonl([ROWS[0], {"prompt": None, "answer": "2"}])},
    ),
    "list prompt": Case(
        ["data.path={tmp}/d.jsonl"], "row 1: 'prompt'[0] is '1'; a conversational prompt is a list of messages", DataError,
        files={"d.jsonl": jsonl([{"prompt": ["1", "+"], "answer": "2"}])},
    ),
    "NaN answer": Case(
        ["data.path={tmp}/d.jsonl"], "row 1: field 'answer' (data.answer_field) is nan (float)", DataError,
        files={"d.jsonl": '{"prompt": "1+1=", "answer": NaN}\n'},
    ),
    "task too small": Case(
        ["data.source=arithmetic", "data.size=500", "data.params={digits: 1}"],
        "data.source=arithmetic with data.size=500, data.params={'digits': 1}: only 100 distinct", DataError,
    ),
    "prompt too long in characters": Case(
        ["data.path={tmp}/d.jsonl", "data.max_prompt_length=64"],
        "has a prompt of 2000 characters: no tokenizer output of it fits data.max_prompt_length=64", DataError,
        files={"d.jsonl": jsonl([ROWS[0], {"prompt": "1+" * 1000, "answer": "2"}])},
    ),
    "duplicate key in a row": Case(
        ["data.path={tmp}/d.jsonl"], "d.jsonl:1: key 'answer' is given twice", DataError,
        files={"d.jsonl": '{"prompt": "1+1=", "answer": "2", "answer": "3"}\n'},
    ),
    "lone surrogate in a prompt": Case(
        ["data.path={tmp}/d.jsonl"], "row 1: field 'prompt' (data.prompt_field) holds a lone surrogate", DataError,
        files={"d.jsonl": '{"prompt": "1+1=\\ud800", "answer": "2"}\n'},
    ),
    "chat message with null content": Case(
        ["data.path={tmp}/d.jsonl", "data.template=none"], "'prompt'[0] has content null", DataError,
        files={"d.jsonl": '{"prompt": [{"role": "user", "content": null}], "answer": "2"}\n'},
    ),
    "seed too large for the shuffle": Case(["seed=100000000000000000000"], "is too large", ConfigError),
    "leading-zero step count": Case(["train.num_steps=010", "train.max_bad_steps=-1"], "train.max_bad_steps must be",
                                    ConfigError),
    "reward returns a huge int": Case(
        ["reward.functions=[{name: 'bad_rewards:huge_int'}]"], "returned an int of 401 digits for example 0", RewardError
    ),
    "reward total not finite": Case(
        ["reward.functions=[{name: 'bad_rewards:near_max', weight: 10}]"],
        "the total reward of example 0 (prompt: '", RewardError,
    ),
    "completions alone fill the context": Case(
        ["model.name_or_path={gpt2}", "rollout.max_completion_length=40", "data.template=none"],
        "rollout.max_completion_length alone fills the context", DataError, early=False,
    ),
    "reward calls sys.exit": Case(
        ["reward.functions=[{name: 'bad_rewards:exits'}]"], "reward 'exits' called sys.exit(3) on example 0", RewardError
    ),
    "sft without answers": Case(["data.answer_field=null"], "grpolab sft trains on the reference answers", ConfigError,
                                verb="sft"),
    "eval without rewards": Case(["reward.functions=[]", "data.eval_size=2"], "reward.functions is empty",
                                 ConfigError, verb="eval"),
    "resume, no weights": Case(
        [], "--resume: no intact checkpoint in {tmp}/runs/bad/checkpoints (step_3: model.safetensors or", ConfigError,
        verb="resume", files={f"{CKPT}/step_3/trainer_state.pt": ""},
    ),
    "resume, no trainer state": Case(
        [], "(step_2: trainer_state.pt missing)", ConfigError, verb="resume",
        files={f"{CKPT}/step_2/model.safetensors": ""},
    ),
    "resume, truncated checkpoint": Case(
        [], "(step_1: trainer_state.pt has 3 bytes", ConfigError, verb="resume", from_run=True,
        files={f"{CKPT}/step_1/trainer_state.pt": "PK\x03"},
    ),
    "resume with another G": Case(
        ["rollout.num_generations=4"], "--resume would change what the run was trained with "
        "(rollout.num_generations: 2 -> 4; saved in {tmp}/runs/bad/checkpoints/step_1/config.yaml)",
        ConfigError, verb="resume", from_run=True,
    ),
    "resume as PPO": Case(
        ["algo.name=ppo"], "algo.name: 'grpo' -> 'ppo'", ConfigError, verb="resume", from_run=True
    ),
    "resume with another model": Case(
        ["model.name_or_path={gpt2}"], "pass --resume-allow-change model.name_or_path", ConfigError,
        verb="resume", from_run=True,
    ),
    "resume with another seed and rewards": Case(
        ["seed=1", "reward.functions=[{name: r1_format}]"], "reward.functions: [{'name': 'exact_match'", ConfigError,
        verb="resume", from_run=True,
    ),
    "resume as PPO, allowed": Case(
        ["algo.name=ppo", "log.resume_allow=[algo]"], "it was not a PPO run, so algo.name=ppo cannot resume it",
        ConfigError, verb="resume", from_run=True, early=False,
    ),
    "overwrite with a mistyped model": Case(
        ["log.overwrite=true", "model.name_or_path={tmp}/nope"], "model.name_or_path: {tmp}/nope does not exist",
        ModelLoadError, from_run=True, kept=f"{CKPT}/step_1/model.safetensors",
    ),
    "reward fails during training": Case(
        ["reward.functions=[{name: 'bad_rewards:raises'}]", "reward.dry_run_examples=0"],
        "step 1: 2 of 2 groups (100%) were dropped for failed samples (reward_error 2; the first: reward 'raises' "
        "raised ZeroDivisionError on example 0 (prompt: ",
        TrainingError, early=False,
    ),
    "constant reward": Case(
        ["reward.functions=[{name: 'bad_rewards:constant'}]", "train.num_steps=4", "train.max_no_signal_steps=1"],
        "steps 1-1: 1 steps in a row carried no learning signal: every completion of every group got the same reward",
        TrainingError, early=False,
    ),
    "reward never applies": Case(
        ["reward.functions=[{name: 'bad_rewards:never'}]", "train.num_steps=4", "train.max_no_signal_steps=1"],
        "1 steps in a row carried no learning signal: no completion got a valid reward", TrainingError, early=False,
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


@pytest.fixture(scope="module")
def trained_run(tiny_model_dir, dataset, tmp_path_factory) -> Path:
    """A real one-step run (checkpoints/step_1 with its manifest and config), copied by from_run cases."""
    out = tmp_path_factory.mktemp("trained")
    loop.train(load_config(None, base_overrides(tiny_model_dir, dataset, out)))
    return out / "runs" / "bad"


def setup_case(case: Case, tmp: Path, tiny_model_dir, dataset, gpt2_dir, trained=None):
    if case.from_run:
        shutil.copytree(trained, tmp / "runs" / "bad")
    for name, content in case.files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            (tmp / name).write_bytes(content)
        else:
            (tmp / name).write_text(content)

    def fill(text: str) -> str:
        return text.replace("{tmp}", str(tmp)).replace("{gpt2}", gpt2_dir)

    overrides = base_overrides(tiny_model_dir, dataset, tmp) + [fill(o) for o in case.overrides]
    config = str(tmp / "config.yaml") if any(f.startswith("config.yaml") for f in case.files) else None
    return config, overrides, fill(case.message)


def run_verb(verb: str, cfg) -> None:
    if verb in ("train", "resume"):
        loop.train(cfg, resume=verb == "resume")
    elif verb == "sft":
        sft_mod.sft(cfg)
    elif verb == "eval":
        eval_command.evaluate(cfg)
    else:
        raise AssertionError(verb)


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_stops_with_a_message_that_says_how_to_fix_it(
    name, tmp_path, tiny_model_dir, dataset, gpt2_dir, monkeypatch, request
):
    case = CASES[name]
    if name == "cuda without CUDA" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    trained = request.getfixturevalue("trained_run") if case.from_run else None
    config, overrides, message = setup_case(case, tmp_path, tiny_model_dir, dataset, gpt2_dir, trained)
    if case.early:

        def no_model(*args, **kwargs):
            raise AssertionError("the policy was loaded before the bad input was found")

        monkeypatch.setattr(assemble_mod, "load_policy", no_model)  # train, sft and eval load it there
    with pytest.raises(case.error) as err:
        run_verb(case.verb, load_config(config, overrides))
    assert message in str(err.value)
    if case.kept:
        assert (tmp_path / case.kept).exists(), f"{case.kept} was deleted before the error"


@pytest.mark.parametrize(
    "name", ["unknown key", "missing model path", "row without the prompt", "reward raises", "reward stuck in a C regex"]
)
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

    monkeypatch.setattr(assemble_mod, "build_sampler", stop_here)  # the check has run by then: no need to train
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
    # a model folder, a gym entry, a judge's endpoint: covered in their own tests (judges: tests/unit/rewards/judge)
    skip = {"reward_model", "reasoning_gym", "judge", "group_judge"}
    rewards = [build_reward(name, kwargs=kwargs.get(name)) for name in REWARDS if name not in skip]
    example = Example("1+1=", answer="2", meta={"tests": ["assert True"]})
    empty = [Completion("", 1), Completion("", 0, "length")]
    result = score_batch(rewards, empty, [example] * 2, timeout_s=30)
    assert all(v is None or v == v for values in result.components.values() for v in values)
    assert result.components["code_tests"] == [0.0, 0.0]
