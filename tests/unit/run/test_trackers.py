"""log.report_to: every tracker gets the config, each metric and the completions table, read back from its store."""

import importlib
import json

import pytest
from tracker_records import trackio_logs

from grpolab.config import load_config
from grpolab.errors import ConfigError
from grpolab.runtime.logging import RunLogger, read_metrics
from grpolab.runtime.trackers import check_trackers

CONFIG = {"algo": {"name": "grpo", "beta": 0.04}, "log": {"run_name": "r"}}
ROWS = [
    {"prompt": "1+1=", "completion": "2", "reward": 1.5, "reward/exact": 1.0, "reward/fmt": 0.5, "advantage": 0.7},
    {"prompt": "1+1=", "completion": "x", "reward": None, "reward/exact": None, "reward/fmt": None, "advantage": -0.7},
]


def _log_two_steps(run_dir, report_to, project, *, resume_step=None, first=1):
    logger = RunLogger(
        run_dir, resume_step=resume_step, report_to=report_to, project=project, run_name="r", config=CONFIG
    )
    logger.log(first, {"reward": 0.25, "kl": float("nan"), "sys/peak_mem_mb": 7.0})
    logger.samples(first, ROWS)
    logger.log(first + 1, {"reward": 0.5, "kl": 0.125})
    logger.close()


def test_wandb_offline_gets_config_metrics_table_and_resumes_the_same_run(tmp_path, wandb_offline):
    run_dir = tmp_path / "run"
    _log_two_steps(run_dir, ["wandb"], "proj")
    run_id = json.loads((run_dir / "trackers.json").read_text())["wandb"]["id"]
    _log_two_steps(run_dir, ["wandb"], "proj", resume_step=2, first=3)

    first, resumed = wandb_offline.runs()
    assert first.run_id == resumed.run_id == run_id
    assert (first.project, first.name) == ("proj", "r")
    assert first.config["algo"] == {"name": "grpo", "beta": 0.04}
    metrics = [(h["_step"], h.get("train/reward"), h.get("train/kl")) for h in first.history + resumed.history]
    assert [m for m in metrics if m[1] is not None] == [(1, 0.25, None), (2, 0.5, 0.125), (3, 0.25, None), (4, 0.5, 0.125)]
    tables = [(h["_step"], h["completions"]) for h in first.history + resumed.history if "completions" in h]
    assert [step for step, _ in tables] == [1, 3]
    assert tables[0][1] == ROWS


def test_trackio_local_store_gets_config_metrics_table_and_resumes(tmp_path, trackio_dir):
    from trackio.sqlite_storage import SQLiteStorage

    run_dir = tmp_path / "run"
    _log_two_steps(run_dir, ["trackio"], "grpolab-test")
    assert SQLiteStorage.get_project_db_path("grpolab-test").parent == trackio_dir
    state = json.loads((run_dir / "trackers.json").read_text())["trackio"]
    _log_two_steps(run_dir, ["trackio"], "grpolab-test", resume_step=2, first=3)

    assert SQLiteStorage.get_runs("grpolab-test") == ["r"]  # one run, continued
    assert json.loads((run_dir / "trackers.json").read_text())["trackio"] == state
    config = SQLiteStorage.get_run_config("grpolab-test", "r")
    assert config["algo"] == {"name": "grpo", "beta": 0.04}
    logs = trackio_logs("grpolab-test", "r")
    metrics = [(r["step"], r["train/reward"], r.get("train/kl")) for r in logs if "train/reward" in r]
    assert metrics == [(1, 0.25, None), (2, 0.5, 0.125), (3, 0.25, None), (4, 0.5, 0.125)]
    tables = [(r["step"], r["completions"]) for r in logs if "completions" in r]
    assert [step for step, _ in tables] == [1, 3] and tables[0][1] == ROWS


def test_tensorboard_gets_scalars_and_the_table_as_text(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _log_two_steps(tmp_path, ["tensorboard"], "p")
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0}).Reload()
    # TRL's names charted as TRL's trackers chart them (train/ in front); grpolab's own as logged
    assert [(e.step, e.value) for e in events.Scalars("train/reward")] == [(1, 0.25), (2, 0.5)]
    assert [e.step for e in events.Scalars("train/kl")] == [2]  # NaN left out
    assert [(e.step, e.value) for e in events.Scalars("sys/peak_mem_mb")] == [(1, 7.0)]
    assert read_metrics(tmp_path)[0] == {"step": 1, "reward": 0.25, "kl": None, "sys/peak_mem_mb": 7.0, "nonfinite_count": 1}
    (text,) = events.Tensors("completions/text_summary")
    table = text.tensor_proto.string_val[0].decode()
    assert "| prompt | completion | reward | reward/exact | reward/fmt | advantage |" in table
    assert "| 1+1= | 2 | 1.5 | 1.0 | 0.5 | 0.7 |" in table


def test_report_to_config_and_tensorboard_back_compat(tmp_path):
    assert load_config(None, []).log.trackers == ("tensorboard",)
    assert load_config(None, ["log.tensorboard=false"]).log.trackers == ()
    cfg = load_config(None, ["log.report_to=[wandb, trackio]", "log.project=p"])
    assert cfg.log.trackers == ("wandb", "trackio") and cfg.log.project == "p"
    assert load_config(None, ["log.report_to=trackio"]).log.trackers == ("trackio",)
    assert load_config(None, ["log.report_to=[]"]).log.trackers == ()
    with pytest.raises(ConfigError, match=r"log.report_to\[0\]': 'wandbb' is not one of .*did you mean 'wandb'"):
        load_config(None, ["log.report_to=[wandbb]"])
    with pytest.raises(ConfigError, match="lists a tracker twice"):
        load_config(None, ["log.report_to=[wandb, wandb]"])
    RunLogger(tmp_path, tensorboard=False).close()  # the old keyword still works
    assert not (tmp_path / "tb").exists() and not (tmp_path / "trackers.json").exists()


def test_wandb_online_without_a_key_says_how_to_go_on(tmp_path, wandb_offline, monkeypatch):
    import wandb

    def no_key(**kwargs):
        raise wandb.errors.UsageError("api_key not configured (no-tty)")

    monkeypatch.setattr(wandb, "init", no_key)
    with pytest.raises(ConfigError, match="wandb could not start a run .*set WANDB_MODE=offline"):
        RunLogger(tmp_path, report_to=["wandb"])


def test_a_missing_tracker_package_says_what_to_install(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    monkeypatch.delitem(__import__("sys").modules, "wandb", raising=False)
    with pytest.raises(ConfigError, match=r"pip install 'grpolab\[wandb\]'"):
        RunLogger(tmp_path, report_to=["wandb"])
    _fail_import(monkeypatch, "trackio", ImportError("No module named 'trackio'"))
    with pytest.raises(ConfigError, match=r"names trackio, which is not installed: pip install 'grpolab\[trackio\]'"):
        check_trackers(["tensorboard", "trackio"])


def _fail_import(monkeypatch, module: str, exc: Exception) -> None:
    """importlib.import_module raises ``exc`` for ``module`` (the trackers import through it)."""
    real = importlib.import_module

    def fake(name, *args, **kwargs):
        if name == module:
            raise exc
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", fake)


def test_a_tracker_that_breaks_while_importing_is_one_config_error(monkeypatch):
    _fail_import(monkeypatch, "trackio", AttributeError("module 'numpy' has no attribute 'float'"))
    with pytest.raises(
        ConfigError, match=r"log.report_to names trackio, but importing it failed \(AttributeError: module 'numpy' "
        r"has no attribute 'float'\); reinstall it"
    ):
        check_trackers(["trackio"])


def test_an_unwritable_trackio_store_is_refused_before_the_model(trackio_dir, tmp_path, monkeypatch):
    """trackio writes from a background thread and drops what it cannot write (exit 0, no metrics)."""
    import trackio.utils

    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the store's parent should be")  # unwritable even for root
    monkeypatch.setattr(trackio.utils, "TRACKIO_DIR", blocker / "trackio")
    with pytest.raises(ConfigError, match=r"log.report_to: trackio's store .*not_a_folder/trackio cannot be written "
                       r"\(Not a directory\); set TRACKIO_DIR"):
        check_trackers(["trackio"])
