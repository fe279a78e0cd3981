"""Failed samples in a real run (docs/training.md, "Failed samples"): a reward whose judge is gone for one prompt
drops that prompt's group every step, the run trains on the others, and metrics.jsonl counts it."""

from __future__ import annotations

import json

import pytest

from grpolab.cli import main
from grpolab.commands.train import train
from grpolab.config import load_config
from grpolab.runtime.logging import read_metrics
from grpolab.tasks.arithmetic import arithmetic_examples
from grpolab.types import FAILURE_KINDS


def _data(tmp_path, size: int):
    rows = [{"prompt": e.prompt, "answer": e.answer} for e in arithmetic_examples(size=size, seed=0, digits=1)]
    data = tmp_path / "add.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows, data


def test_a_prompt_whose_reward_fails_is_dropped_every_step_and_counted(tiny_model_dir, tmp_path):
    rows, data = _data(tmp_path, 4)
    bad = rows[0]["prompt"]
    assert sum(bad in r["prompt"] for r in rows) == 1
    cfg = load_config(None, [
        f"model.name_or_path={tiny_model_dir}", f"data.path={data}", "rollout.num_generations=2",
        "rollout.max_completion_length=4", "train.prompts_per_step=4", "train.num_steps=2",
        f"reward.functions=[{{name: 'toy_rewards:digit_fraction_failing_on', kwargs: {{prompt: '{bad}'}}}}]",
        "reward.dry_run_examples=0", f"log.output_dir={tmp_path}", "log.run_name=failed", "log.progress=false",
        "log.samples_every=1",
    ])  # fmt: skip
    result = train(cfg)
    metrics = read_metrics(result.run_dir)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:  # every step draws the 4 prompts: the bad one's group is dropped, 3 train
        assert (m["failures/reward_error"], m["failures/groups_dropped"]) == (1, 1)
        assert m["failures/group_share"] == pytest.approx(0.25) and m["failures/retries"] == 4
        assert all(m[f"failures/{kind}"] == 0 for kind in FAILURE_KINDS if kind != "reward_error")
    samples = [json.loads(line) for line in (result.run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 3 * 2 and not any(bad in s["prompt"] for s in samples)  # never trained, never a 0


def test_too_many_failed_groups_stop_the_cli_with_one_line_and_status_2(tiny_model_dir, tmp_path, capsys):
    """A reward that fails on everything once training runs (the dry run skipped, which would have caught it)."""
    _, data = _data(tmp_path, 8)
    code = main([
        "--log-level", "ERROR", "train", f"model.name_or_path={tiny_model_dir}", f"data.path={data}",
        "reward.functions=[{name: 'bad_rewards:raises'}]", "reward.dry_run_examples=0", "rollout.num_generations=2",
        "rollout.max_completion_length=4", "train.prompts_per_step=2", "train.num_steps=1",
        f"log.output_dir={tmp_path}/runs", "log.progress=false", "log.tensorboard=false",
    ])  # fmt: skip
    err = capsys.readouterr().err
    ours = [line for line in err.splitlines() if line.startswith("grpolab")]  # transformers' loading bars aside
    assert code == 2 and "Traceback" not in err and len(ours) == 1
    assert ours[0].startswith(
        "grpolab: error: step 1: 2 of 2 groups (100%) were dropped for failed samples (reward_error 2; the first: "
        "reward 'raises' raised ZeroDivisionError on example 0 (prompt: "
    )
    assert ours[0].endswith(
        "more than train.max_failed_group_share=0.5. Fix what failed, give it more retries (reward.max_retries, "
        "env.max_retries), or raise train.max_failed_group_share; nothing of this step was logged or saved, and no "
        "checkpoint was written yet"
    )
