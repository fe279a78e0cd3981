"""Interrupted demos and recipes: ``grpolab demo --agent`` stopped by Ctrl-C during GRPO exits non-zero with
no report and no evaluation of a partial model; ``grpolab recipe`` stopped by Ctrl-C continues with
``--resume``, keeping its base evaluation and checkpoints (nothing retrained, nothing deleted)."""

from __future__ import annotations

import json
import os
import signal

import grpolab.commands.train as loop
import grpolab.studies.recipe as recipe_command
import grpolab.training.sampling as sampling
from grpolab.cli import main


def _sigint_on_sample_call(monkeypatch, n: int) -> None:
    """SIGINT to this process during the n-th sampling of a step (as Ctrl-C would arrive)."""
    real, calls = loop.sample_step, []

    def sample_step(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "sample_step", sample_step)
    assert sampling.sample_step is real


def test_agent_demo_stopped_during_grpo_exits_non_zero_and_claims_nothing(tmp_path, monkeypatch, capsys):
    _sigint_on_sample_call(monkeypatch, 1)
    out = tmp_path / "agent"
    code = main(["demo", "--agent", "--size", "tiny", "--out", str(out), "log.progress=false", "log.checkpoint_every=1"])
    assert code == 130
    assert "grpolab: interrupted" in capsys.readouterr().err
    assert not (out / "report.md").exists() and not (out / "agent_eval.json").exists()
    assert (out / "checkpoints" / "step_1").is_dir()  # the step that ran is saved


def _recipe_args(model_dir, dataset, out) -> list[str]:
    return [
        f"model.name_or_path={model_dir}", f"data.path={dataset}", "data.eval_size=4",
        "reward.functions=[{name: exact_match}]", "rollout.num_generations=2", "rollout.max_completion_length=3",
        "train.num_steps=3", "train.prompts_per_step=2", "train.max_no_signal_steps=0", "log.checkpoint_every=1",
        "eval.num_samples=2", f"log.output_dir={out}", "log.run_name=recipe", "log.progress=false",
        "log.tensorboard=false",
    ]  # fmt: skip


def test_an_interrupted_recipe_continues_with_resume(tiny_model_dir, addition_jsonl, tmp_path, monkeypatch, capsys):
    args = _recipe_args(tiny_model_dir, addition_jsonl(12), tmp_path)
    real_evaluate, evaluated = recipe_command.evaluate, []

    def evaluate(cfg, paths, **kwargs):
        evaluated.append([str(p) for p in paths])
        return real_evaluate(cfg, paths, **kwargs)

    monkeypatch.setattr(recipe_command, "evaluate", evaluate)
    _sigint_on_sample_call(monkeypatch, 2)
    assert main(["recipe", *args]) == 130
    assert "continue with: grpolab recipe --resume" in capsys.readouterr().err
    run = tmp_path / "recipe"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_1", "step_2"]
    assert not (run / "report.md").exists()
    monkeypatch.setattr(loop, "sample_step", sampling.sample_step)
    assert main(["recipe", *args]) == 2  # without --resume: told to pass it, nothing deleted
    assert "Pass --resume" in capsys.readouterr().err and (run / "checkpoints" / "step_2").is_dir()
    assert main(["recipe", "--resume", *args]) == 0
    assert len(evaluated) == 2 and evaluated[-1] == [str(run / "checkpoints" / "step_3")]  # base not redone
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    evals = json.loads((run / "eval.json").read_text())
    assert [e["label"] for e in evals] == ["base", "GRPO"] and evals[1]["path"].endswith("step_3")
    assert "| GRPO maj@K |" in (run / "report.md").read_text()
