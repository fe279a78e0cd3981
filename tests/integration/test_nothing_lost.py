"""Nothing lost, one line each: unsafe or half-written checkpoints, export targets, eval of several models,
Ctrl-C during SFT, and grid folders that would collide."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
import torch

import grpolab.commands.eval as eval_command
import grpolab.commands.sft as sft_mod
import grpolab.commands.train as loop
import grpolab.runtime.assemble as assemble
from grpolab.cli import main
from grpolab.config import ConfigError, load_config
from grpolab.eval.results import load_evals
from grpolab.models.loading import ModelLoadError
from grpolab.runtime import checkpoint as ckpt
from grpolab.runtime import sharded


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def overrides(model_dir, dataset, out, *extra) -> list[str]:
    return [
        f"model.name_or_path={model_dir}",
        f"data.path={dataset}",
        "reward.functions=[{name: exact_match}]",
        "rollout.num_generations=2",
        "rollout.max_completion_length=4",
        "train.prompts_per_step=2",
        "train.num_steps=1",
        f"log.output_dir={out}",
        "log.run_name=run",
        "log.progress=false",
        *extra,
    ]


@pytest.fixture(scope="module")
def trained(tiny_model_dir, addition_jsonl, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trained")
    loop.train(load_config(None, overrides(tiny_model_dir, addition_jsonl(16), out)))
    return out / "run"


def copy_run(trained: Path, tmp_path: Path) -> Path:
    shutil.copytree(trained, tmp_path / "run")
    return tmp_path / "run"


class Payload:
    """A pickle that runs code when loaded with weights_only=False."""

    def __reduce__(self):
        return (os.system, (f"touch {os.environ['GRPOLAB_TEST_PWNED']}",))


def test_a_crafted_trainer_state_is_refused_without_running_it(trained, tmp_path, tiny_model_dir, addition_jsonl,
                                                               monkeypatch):
    run = copy_run(trained, tmp_path)
    step = run / "checkpoints" / "step_1"
    state = torch.load(step / "trainer_state.pt", weights_only=True)
    state["evil"] = Payload()
    pwned = tmp_path / "pwned"
    monkeypatch.setenv("GRPOLAB_TEST_PWNED", str(pwned))
    torch.save(state, step / "trainer_state.pt")
    ckpt.write_manifest(step)  # intact by its manifest: only the content is hostile
    monkeypatch.setattr(assemble, "load_policy", lambda *a, **k: pytest.fail("the model loaded"))  # judged first
    cfg = load_config(None, overrides(tiny_model_dir, addition_jsonl(16), tmp_path))
    with pytest.raises(ckpt.CheckpointError, match=r"trainer_state.pt holds more than tensors and plain data "
                       r"\(it names posix.system\)"):
        loop.train(cfg, resume=True)
    assert not pwned.exists()


def test_a_disk_full_during_a_checkpoint_is_one_error_and_the_last_checkpoint_resumes(
    trained, tmp_path, tiny_model_dir, addition_jsonl, monkeypatch
):
    run = copy_run(trained, tmp_path)
    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):
        if str(f).endswith("trainer_state.pt"):
            raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0: file write failed")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk)
    cfg = load_config(None, overrides(tiny_model_dir, addition_jsonl(16), tmp_path, "train.num_steps=2"))
    with pytest.raises(ckpt.CheckpointError, match=r"writing the checkpoint step_2 failed \(RuntimeError: .*file "
                       r"write failed\) with \d+ MiB free on .*; the previous checkpoint .*step_1 is intact"):
        loop.train(cfg, resume=True)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_1"]  # no .tmp_step_2 left
    monkeypatch.setattr(torch, "save", real_save)
    assert loop.train(cfg, resume=True).final_step == 2


def test_a_sharded_checkpoint_resumed_at_another_world_size_fails_before_the_model(
    trained, tmp_path, tiny_model_dir, addition_jsonl, monkeypatch
):
    run = copy_run(trained, tmp_path)
    (run / "checkpoints" / "step_1" / sharded.MARKER).write_text('{"world_size": 2, "step": 1}\n')
    monkeypatch.setattr(assemble, "load_policy", lambda *a, **k: pytest.fail("the model loaded"))
    cfg = load_config(None, overrides(tiny_model_dir, addition_jsonl(16), tmp_path, "train.num_steps=2"))
    with pytest.raises(ConfigError, match=r"is a sharded checkpoint written by 2 processes and this job has 1: "
                       r"resume it with torchrun --nproc_per_node=2"):
        loop.train(cfg, resume=True)


@pytest.fixture
def sharded_checkpoint(tmp_path) -> Path:
    """A real DCP checkpoint, written by one process (as one rank of a job would)."""
    from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=16, num_layers=1, num_heads=2)
    opt = torch.optim.AdamW(model.parameters())
    return sharded.save(tmp_path / "job", 1, models={"model": model}, optimizers={"optimizer": (model, opt)},
                        state={"step": 1}, tokenizer=tok, keep_last=2)


def export_error(capsys, *args) -> str:
    capsys.readouterr()  # what earlier calls printed
    assert main(["export", *map(str, args)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("grpolab: error: ") and "\n" not in err
    return err


def test_export_refuses_bad_targets_and_damaged_checkpoints_in_one_line(sharded_checkpoint, tmp_path, capsys):
    ckpts = sharded_checkpoint.parent
    assert "is inside the run's checkpoints folder" in export_error(capsys, sharded_checkpoint, ckpts / "exported")
    assert not (ckpts / "exported").exists()
    (tmp_path / "a_file").write_text("x")
    assert "is a file; give a folder" in export_error(capsys, sharded_checkpoint, tmp_path / "a_file")
    assert (tmp_path / "a_file").read_text() == "x"
    assert main(["export", str(sharded_checkpoint), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert "already holds files" in export_error(capsys, sharded_checkpoint, tmp_path / "out")
    shard = next((sharded_checkpoint / "dcp").glob("*.distcp"))
    shard.rename(tmp_path / "shard")
    assert f"is damaged (dcp/{shard.name} is missing)" in export_error(capsys, sharded_checkpoint, tmp_path / "o2")
    shard.with_name(".metadata").unlink()
    (sharded_checkpoint / ckpt.MANIFEST).unlink()  # an older checkpoint: no manifest to say what is missing
    assert "(dcp/.metadata is missing)" in export_error(capsys, sharded_checkpoint, tmp_path / "o3")


def test_an_exported_model_with_a_shard_missing_fails_before_the_model_loads(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from grpolab.runtime.preflight import check_model_source

    folder = tmp_path / "exported"
    AutoModelForCausalLM.from_pretrained(tiny_model_dir).save_pretrained(folder, max_shard_size="100KB")
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 1
    shards[1].unlink()
    cfg = load_config(None, [f"model.name_or_path={folder}"])
    with pytest.raises(ModelLoadError, match=rf"{shards[1].name}, listed in model.safetensors.index.json, is missing"):
        check_model_source(cfg.model)


def test_eval_checks_every_path_first_and_keeps_each_finished_model(
    trained, tmp_path, tiny_model_dir, addition_jsonl, monkeypatch
):
    base = overrides(tiny_model_dir, addition_jsonl(16), tmp_path, "data.eval_size=2", "eval.num_samples=2",
                     "eval.greedy=false", f"eval.output_dir={tmp_path / 'eval'}")
    loaded = []
    real_load = eval_command.load_model
    monkeypatch.setattr(eval_command, "load_model", lambda cfg: loaded.append(cfg.name_or_path) or real_load(cfg))
    cfg = load_config(None, [*base, f"eval.checkpoints=[{tiny_model_dir}, {tmp_path}/missing]"])
    with pytest.raises(ModelLoadError, match="missing does not exist"):
        eval_command.evaluate(cfg)
    assert loaded == []  # the second path was checked before the first model loaded
    real_model = eval_command.evaluate_model
    calls = []

    def stop_on_second(*args, **kwargs):
        calls.append(kwargs["label"])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_model(*args, **kwargs)

    monkeypatch.setattr(eval_command, "evaluate_model", stop_on_second)
    step = trained / "checkpoints" / "step_1"
    with pytest.raises(KeyboardInterrupt):
        eval_command.evaluate(load_config(None, [*base, f"eval.checkpoints=[{tiny_model_dir}, {step}]"]))
    (kept,) = load_evals(tmp_path / "eval" / "eval.json")
    assert kept.path == tiny_model_dir and 0 <= kept.pass_at[1] <= 1


def sft_config(model_dir, dataset, out, steps=4):
    return load_config(None, [*overrides(model_dir, dataset, out), f"sft.steps={steps}", "sft.batch_size=4",
                              "sft.lr=1e-3", "sft.target_accuracy=null", f"sft.output_dir={out}/sft"])


def test_sigint_during_sft_saves_a_checkpoint_that_resumes_exactly(tiny_model_dir, addition_jsonl, tmp_path,
                                                                   monkeypatch, capsys):
    from safetensors.torch import load_file

    dataset = addition_jsonl(16)
    alone = sft_mod.sft(sft_config(tiny_model_dir, dataset, tmp_path / "alone"), progress=False)
    real_step = sft_mod.sft_loss_step
    seen = []

    def interrupt_at_two(*args, **kwargs):
        seen.append(1)
        if len(seen) == 2:
            signal.raise_signal(signal.SIGINT)  # arrives during step 2: step 2 finishes, then the checkpoint
        return real_step(*args, **kwargs)

    monkeypatch.setattr(sft_mod, "sft_loss_step", interrupt_at_two)
    cfg = sft_config(tiny_model_dir, dataset, tmp_path / "stopped")
    stopped = sft_mod.sft(cfg, progress=False)
    assert stopped.stopped_by == signal.SIGINT and stopped.steps == 2
    assert (cfg.sft_dir / "checkpoints" / "step_2" / "trainer_state.pt").is_file()
    assert not (cfg.sft_dir / "model.safetensors").exists()
    with pytest.raises(ConfigError, match="holds the checkpoint of a stopped SFT run \\(step_2\\): continue it with "
                       "grpolab sft --resume"):
        sft_mod.sft(cfg, progress=False)
    monkeypatch.setattr(sft_mod, "sft_loss_step", real_step)
    assert main(["--log-level", "ERROR", "sft", "--resume", "--config", str(cfg.sft_dir / "config.yaml")]) == 0
    assert not (cfg.sft_dir / "checkpoints").exists()
    a, b = load_file(alone.output_dir / "model.safetensors"), load_file(cfg.sft_dir / "model.safetensors")
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-6, rtol=1e-5, msg=k)
    capsys.readouterr()


def test_hacking_betas_that_print_alike_get_their_own_folders():
    from grpolab.studies.hacking import run_name

    assert run_name(0.04, 0) == "beta0.04_seed0" and run_name(0.0, 1) == "beta0_seed1"
    assert run_name(0.040000001, 0) == "beta0.040000001_seed0"
    assert run_name(0.1 + 0.2, 0) == "beta0.30000000000000004_seed0"
