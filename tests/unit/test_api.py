"""The Python API (grpolab.api): configs, rewards and datasets in TRL's shape, checked before any model loads."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grpolab.api import GRPOTrainer, build_reward_funcs, dataset_rows, show_progress_logs
from grpolab.config import Config
from grpolab.errors import ConfigError, GrpolabError
from grpolab.rewards import TrlReward

SRC = str(Path(__file__).parents[2] / "src")


def reward_num_unique_chars(completions, **kwargs):
    """TRL's quickstart reward."""
    return [float(len(set(c))) for c in completions]


def exact(completion, example):
    """A grpolab per-sample reward."""
    return float(completion.text == example.answer)


@pytest.fixture
def make_trainer(tiny_model_dir):
    """GRPOTrainer(tiny model, reward, **kw) with two rows and one TRL reward unless given."""

    def make(**kw):
        kw.setdefault("train_dataset", [{"prompt": "1+1=", "solution": "2"}, {"prompt": "2+2=", "solution": "4"}])
        return GRPOTrainer(tiny_model_dir, kw.pop("reward_funcs", reward_num_unique_chars), **kw)

    return make


def test_the_config_records_what_the_call_gave(make_trainer, tiny_model_dir):
    trainer = make_trainer(
        reward_funcs=[reward_num_unique_chars, exact, "r1_format"],
        reward_weights=[1.0, 2.0, 0.5],
        args={"algo.beta": 0.0, "train": {"num_steps": 3}, "train.prompts_per_step": 4},
        processing_class=tiny_model_dir,
    )
    cfg = trainer.args
    assert isinstance(cfg, Config)
    assert (cfg.model.name_or_path, cfg.model.tokenizer) == (tiny_model_dir, tiny_model_dir)
    assert (cfg.algo.beta, cfg.train.num_steps, cfg.train.prompts_per_step) == (0.0, 3, 4)
    specs = [(s.name, s.weight, s.kind) for s in cfg.reward.functions]
    assert specs == [
        (f"{__name__}:reward_num_unique_chars", 1.0, "trl"),
        (f"{__name__}:exact", 2.0, "auto"),
        ("r1_format", 0.5, "auto"),
    ]
    assert [r.name for r in trainer.rewards] == ["reward_num_unique_chars", "exact", "r1_format"]
    assert isinstance(trainer.rewards[0].reward, TrlReward)
    # TRL's trainer.reward_funcs: the functions as given; a grpolab name (TRL has none): grpolab's reward object
    assert trainer.reward_funcs == [reward_num_unique_chars, exact, trainer.rewards[2].reward]
    assert cfg.data.answer_field is None  # the rows have no "answer" column, as TRL's datasets
    assert [e.prompt for e in trainer.train_dataset] == ["1+1=", "2+2="]
    assert trainer.train_dataset[0].meta["row"] == {"prompt": "1+1=", "solution": "2"}


def test_a_trl_reward_is_called_with_the_rows_columns(make_trainer):
    def matches(completions, solution, **kwargs):
        return [float(c == s) for c, s in zip(completions, solution, strict=True)]

    trainer = make_trainer(reward_funcs=matches)
    from grpolab.types import Completion

    reward = trainer.rewards[0].reward
    assert reward([Completion(text="2", num_tokens=1), Completion(text="5", num_tokens=1)], trainer.train_dataset) == [1.0, 0.0]


def test_a_config_object_with_the_default_answer_field_takes_rows_without_answers(make_trainer):
    trainer = make_trainer(args=Config())
    assert trainer.args.data.answer_field is None and trainer.train_dataset[1].meta["row"]["solution"] == "4"


def test_conversational_rows_and_an_answer_column(make_trainer):
    rows = [{"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"}]
    trainer = make_trainer(train_dataset=rows)
    (example,) = trainer.train_dataset
    assert example.messages == ({"role": "user", "content": "1+1?"},) and example.answer == "2"
    assert trainer.args.data.answer_field == "answer"


def test_a_datasets_dataset_is_read_row_by_row():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"prompt": "a", "n": 1}, {"prompt": "b", "n": 2}])
    assert dataset_rows(ds) == [{"prompt": "a", "n": 1}, {"prompt": "b", "n": 2}]
    with pytest.raises(ValueError, match=r"pass one split \(e.g. dataset\['train'\]\)"):
        dataset_rows(datasets.DatasetDict({"train": ds}))


@pytest.mark.parametrize("column", ["image", "images"])
def test_rows_with_images_are_refused_and_an_empty_image_column_is_not(column):
    """TRL's vision-language datasets: a text model would silently train without the images."""
    prompt = [{"role": "user", "content": "What color is the sky?"}]
    with pytest.raises(GrpolabError, match=f"eval_dataset has an '{column}' column: grpolab trains text models only"):
        dataset_rows([{"prompt": prompt, column: None}, {"prompt": prompt, column: "<a PIL image>"}], "eval_dataset")
    assert dataset_rows([{"prompt": prompt, column: None if column == "image" else []}]) == [
        {"prompt": prompt, column: None if column == "image" else []}
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"train_dataset": ["just text"]}, r"train_dataset row 1 is a str"),
        ({"train_dataset": []}, r"train_dataset holds no rows"),
        ({"train_dataset": None}, r"`train_dataset` is required unless an `environment_factory` owns the data: it is None and the config names no data \(data.path is empty\)"),
        ({"train_dataset": [{"question": "x"}]}, r"train_dataset row 1 has no field 'prompt'"),
        ({"reward_weights": [1.0, 2.0]}, r"reward_weights has 2 values for 1 reward_funcs"),
        ({"reward_funcs": "no_such_reward_name:here"}, r"reward_funcs\[0\]: reward 'no_such_reward_name:here': cannot import"),
        ({"reward_funcs": [exact, exact]}, r"reward_funcs\[0\] and reward_funcs\[1\] are both named 'exact'"),
        ({"args": {"reward": {"functions": [{"name": "r1_format"}]}}}, r"given twice, as reward_funcs and"),
        ({"args": {"data.path": "x.jsonl"}}, r"given twice, as train_dataset and in the config's data.path"),
        ({"args": {"algo.bta": 0.0}}, r"algo.bta"),
        ({"resume": 1}, None),
    ],
)
def test_bad_calls_fail_with_one_line_naming_the_argument(kwargs, message, make_trainer):
    if "resume" in kwargs:
        with pytest.raises(ConfigError, match="pass True"):
            make_trainer().train(resume_from_checkpoint="runs/x/checkpoints/step_2")
        return
    with pytest.raises(ValueError, match=message):
        make_trainer(**kwargs)


def test_a_model_object_or_trl_config_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"model is a object: give a transformers causal LM .*, a peft PeftModel, or"):
        GRPOTrainer(object(), reward_num_unique_chars)

    class GRPOConfig:  # named as TRL's, but not TRL's: not converted
        pass

    with pytest.raises(ConfigError, match="args is a GRPOConfig: give a grpolab Config, a dict, a YAML path"):
        GRPOTrainer("m", reward_num_unique_chars, args=GRPOConfig())


def test_a_string_that_is_no_builtin_is_a_reward_model_as_in_trl(tmp_path, make_trainer):
    with pytest.raises(GrpolabError, match=r"reward model folder .*missing_rm does not exist"):
        build_reward_funcs([str(tmp_path / "missing_rm")])
    trainer_specs = make_trainer(reward_funcs=[reward_num_unique_chars]).args.reward.functions
    assert trainer_specs[0].kind == "trl"


def test_peft_lora_config_becomes_model_lora(make_trainer):
    peft = pytest.importorskip("peft")
    cfg = make_trainer(peft_config=peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"])).args
    lora = cfg.model.lora
    assert (lora.enabled, lora.r, lora.alpha, lora.dropout, lora.target_modules) == (True, 4, 8, 0.1, ("q_proj", "v_proj"))


def test_progress_reaches_a_script_off_a_terminal_without_logging_set_up(tmp_path):
    script = textwrap.dedent(
        """
        from grpolab.api import show_progress_logs
        from grpolab.progress import Progress
        show_progress_logs()
        p = Progress(total=2, title="GRPO")  # stdout is a pipe: log lines, no bar
        p.update(1, reward=0.5)
        p.update(2, reward=0.75)
        p.close()
        """
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120, check=True)
    lines = [line for line in out.stderr.splitlines() if "grpolab.progress" in line]
    assert [line.split("  ")[0:2] for line in lines] == [
        ["INFO grpolab.progress: GRPO step 1/2", "reward 0.5"],
        ["INFO grpolab.progress: GRPO step 2/2", "reward 0.75"],
    ]


def test_a_handler_the_user_set_up_wins(monkeypatch):
    import logging

    package = logging.getLogger("grpolab")
    monkeypatch.setattr(package, "handlers", [])
    root_handler = logging.NullHandler()
    monkeypatch.setattr(logging.getLogger(), "handlers", [root_handler])
    show_progress_logs()
    assert package.handlers == []


def test_the_top_level_names():
    import grpolab

    assert grpolab.GRPOTrainer is GRPOTrainer and "GRPOTrainer" in grpolab.__all__


def test_grpolab_train_is_the_function_after_a_submodule_import():
    import pkgutil

    import grpolab
    import grpolab.training.step  # noqa: F401 - what grpolab's own modules do

    assert callable(grpolab.train)
    submodules = {m.name for m in pkgutil.iter_modules(grpolab.__path__)}
    assert not submodules & set(grpolab.__all__), "a public name is also a subpackage or module"


def test_a_trl_grpo_config_is_converted_with_its_reward_weights_and_the_datasets_length(make_trainer):
    trl = pytest.importorskip("trl", reason="TRL's GRPOConfig object needs trl installed")
    args = trl.GRPOConfig(
        output_dir="runs/trl-out", use_cpu=True, bf16=False, per_device_train_batch_size=4, num_generations=2,
        num_train_epochs=3, reward_weights=[2.0], learning_rate=5e-6, beta=0.04,
        generation_kwargs={"do_sample": True, "top_k": 5},
    )
    trainer = make_trainer(args=args)  # 2 rows, 2 prompts per generation batch, 3 epochs: 3 steps
    cfg = trainer.args
    assert (cfg.train.num_steps, cfg.train.prompts_per_step, cfg.optim.lr, cfg.algo.beta) == (3, 2, 5e-6, 0.04)
    assert [s.weight for s in cfg.reward.functions] == [2.0]
    assert cfg.rollout.top_k == 5  # generation_kwargs' draw-only keys (grpolab.trl.generation)
    assert cfg.train.max_no_signal_steps == 0  # TRL has no such stop
    assert (cfg.log.output_dir, cfg.log.run_name) == ("runs", "trl-out")


def test_save_model_refuses_the_run_s_own_checkpoints_folder(make_trainer, tmp_path):
    """The next training of the run prunes it (log.keep_last) or deletes it (log.overwrite): refused, nothing written."""
    trainer = make_trainer(args={"log.output_dir": str(tmp_path), "log.run_name": "run"})
    root = tmp_path / "run" / "checkpoints"
    for target in (root, root / "mine", root / "step_9" / "model"):
        with pytest.raises(GrpolabError, match=r"save_model: .* is inside the run's checkpoints folder .*save the model outside"):
            trainer.save_model(target)
    assert not root.exists()


def test_steps_without_signal_warn_but_do_not_stop_unless_the_args_say_so(make_trainer):
    """TRL goes on through steps whose groups all have equal rewards; grpolab's CLI stops after 50."""
    assert make_trainer(args={"train.num_steps": 3}).args.train.max_no_signal_steps == 0
    assert make_trainer(args={"train": {"max_no_signal_steps": 7}}).args.train.max_no_signal_steps == 7
    assert make_trainer(args=Config()).args.train.max_no_signal_steps == Config().train.max_no_signal_steps == 50


@pytest.mark.parametrize(("agg", "warned"), [("token-mean", True), ("seq-mean-token-mean", False)])
def test_settings_that_do_less_are_logged_as_trl_logs_its_warnings(make_trainer, caplog, agg, warned):
    import warnings

    from grpolab.config import ConfigWarning

    args = {"algo.importance_level": "sequence", "algo.loss_agg": agg}
    with caplog.at_level("WARNING"), warnings.catch_warnings(record=True) as raised:
        warnings.simplefilter("always")
        make_trainer(args=args)
    logged = [r.getMessage() for r in caplog.records if "weights each sequence by its completion length" in r.getMessage()]
    assert len(logged) == int(warned) and not [w for w in raised if issubclass(w.category, ConfigWarning)]


def test_trls_sequence_level_warning_for_a_loss_that_sums_tokens(make_trainer, caplog):
    trl = pytest.importorskip("trl", reason="TRL's GRPOConfig object needs trl installed")
    for loss_type, warned in (("grpo", False), ("dapo", True), ("dr_grpo", True)):
        caplog.clear()
        args = trl.GRPOConfig(
            output_dir="runs/trl-out", use_cpu=True, bf16=False, per_device_train_batch_size=4, num_generations=2,
            importance_sampling_level="sequence", loss_type=loss_type,
        )
        with caplog.at_level("WARNING"):
            make_trainer(args=args)
        assert ("weights each sequence by its completion length" in caplog.text) == warned, loss_type
