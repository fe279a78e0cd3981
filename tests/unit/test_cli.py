"""The command line's parsing: options and overrides in any order, --log-level on either side of the verb,
--version, and what ``grpolab config`` prints."""

import subprocess
import sys

import pytest
import yaml

import grpolab
from grpolab.cli import main, parse_args
from grpolab.config import config_from_dict
from grpolab.config.view import config_view


def test_resume_before_an_override_and_overrides_on_both_sides():
    args = parse_args(["train", "--resume", "algo.beta=0", "--config", "c.yaml", "train.num_steps=3"])
    assert args.resume and args.config == "c.yaml" and args.overrides == ["algo.beta=0", "train.num_steps=3"]
    args = parse_args(["train", "a.b=1", "--resume-allow-change", "optim.lr", "c.d=2"])
    assert args.overrides == ["a.b=1", "c.d=2"] and args.resume_allow_change == ["optim.lr"]


def test_a_stray_argument_is_still_an_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["train", "--no-such-flag"])
    assert exit_.value.code == 2 and "unrecognized arguments: --no-such-flag" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["export", "ckpt", "out", "x=1"])  # export takes no overrides


@pytest.mark.parametrize(
    "argv, level",
    [
        (["config"], "INFO"),
        (["--log-level", "debug", "config"], "DEBUG"),
        (["config", "--log-level", "warning"], "WARNING"),
        (["--log-level", "debug", "config", "--log-level", "error"], "ERROR"),  # after the verb wins
    ],
)
def test_log_level_before_or_after_the_verb(argv, level):
    assert parse_args(argv).log_level == level


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"grpolab {grpolab.__version__}"


def test_config_prints_the_verbs_sections_with_derivable_nulls_filled(capsys):
    assert main(["config", "model.name_or_path=gpt2", "log.tensorboard=false"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert "sft" not in printed and "reward_model" not in printed and "iterative" not in printed
    assert printed["model"]["tokenizer"] == "gpt2" and printed["log"]["report_to"] == []
    assert "value_lr" not in printed["algo"] and "gamma" not in printed["algo"]  # PPO's critic only
    assert config_view(config_from_dict(printed)) == printed  # it loads back to the same run
    assert main(["config", "--for", "sft", "algo.name=ppo"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert set(printed) == {"model", "data", "train", "sft", "log", "seed"}
    assert main(["config", "algo.name=ppo", "optim.lr=3e-5"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["algo"]["value_lr"] == 3e-5


def test_the_installed_entry_point_takes_options_after_overrides():
    done = subprocess.run(
        [sys.executable, "-m", "grpolab", "config", "seed=3", "--log-level", "error", "--for", "eval"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["seed"] == 3


def test_a_setting_that_does_less_than_it_says_is_one_warning_line():
    """A ConfigWarning reaches the command line as `grpolab: warning: ...`, not as Python's two-line form."""
    proc = subprocess.run(
        [sys.executable, "-m", "grpolab", "config", "rollout.max_batch_sequences=4", "rollout.kv_cache_budget_mb=10"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "kv_cache_budget_mb" in line]
    assert lines == [
        "grpolab: warning: rollout.kv_cache_budget_mb is ignored while rollout.max_batch_sequences is set: drop one of them."
    ]
    assert "ConfigWarning" not in proc.stderr


def test_every_verb_module_imports_and_help_imports_no_torch():
    """The table of verb modules names real modules, and --help stays free of torch (they load when run)."""
    import importlib

    from grpolab.cli import VERB_MODULES

    for module in VERB_MODULES.values():
        importlib.import_module(module)
    code = "import sys; from grpolab.cli import build_parser; build_parser(); assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_an_op_without_a_deterministic_kernel_under_train_deterministic_is_one_line(monkeypatch, capsys):
    """train.deterministic is strict, as TRL's full_determinism: torch raises for an op with no deterministic
    kernel (put_ here, on a CPU); the command line names the op and the key in one line. Any other
    RuntimeError keeps its traceback."""
    import torch

    import grpolab.cli as cli

    def run(args):
        torch.zeros(4).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))

    monkeypatch.setattr(cli, "_dispatch", run)
    torch.use_deterministic_algorithms(True)
    try:
        assert main(["config"]) == 2
    finally:
        torch.use_deterministic_algorithms(False)
    err = capsys.readouterr().err.strip()
    assert err.startswith("grpolab: error: train.deterministic=true, but put_ has no deterministic kernel") and "\n" not in err
    monkeypatch.setattr(cli, "_dispatch", lambda args: torch.zeros(2) @ torch.zeros(3))
    with pytest.raises(RuntimeError, match="size mismatch|shapes cannot be multiplied|inconsistent"):
        main(["config"])


def test_every_verb_has_one_handler_in_the_verb_tables():
    import argparse

    from grpolab.cli import WITH_CONFIG, WITHOUT_CONFIG, build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(WITH_CONFIG) | set(WITHOUT_CONFIG)
    assert not set(WITH_CONFIG) & set(WITHOUT_CONFIG)


def test_a_judges_requests_are_not_logged_one_line_each_unless_debugging():
    import logging

    httpx_log = logging.getLogger("httpx")
    try:
        assert main(["config"]) == 0
        assert httpx_log.level == logging.WARNING
    finally:
        httpx_log.setLevel(logging.NOTSET)
