"""The sampler/trainer log-prob gap guard (rollout.max_logprob_gap) and the sampling guard: a dead engine mid-run
is one line naming the step, and the checkpoints already written survive."""

from __future__ import annotations

import pytest

import grpolab.rollout.hf as hf_mod
from grpolab.cli import main
from grpolab.errors import TrainingError
from grpolab.rollout.base import EngineDied
from grpolab.runtime.guards import GAP_METRIC, SamplerGap


def test_two_steps_in_a_row_above_the_limit_stop_one_does_not(tmp_path):
    gap = SamplerGap(0.1, tmp_path)
    for step, value in enumerate([2e-7, 0.15, 0.02, 0.075], start=1):  # one noisy step, then back: goes on
        gap.observe(step, {GAP_METRIC: value})
    gap.observe(5, {GAP_METRIC: 0.15})
    with pytest.raises(TrainingError, match=r"step 6: .* by 0.15, 0.22 nats per token on the last 2 steps .*"
                                            r"rollout.max_logprob_gap=0.1.*no checkpoint was written yet"):
        gap.observe(6, {GAP_METRIC: 0.22})


def test_no_limit_or_no_metric_never_stops(tmp_path):
    off = SamplerGap(None, tmp_path)
    for step in range(1, 5):
        off.observe(step, {GAP_METRIC: 5.0})
    on = SamplerGap(0.1, tmp_path)
    for step in range(1, 5):
        on.observe(step, {})


def test_a_batch_sampled_with_older_weights_is_not_judged(tmp_path):
    """With rollout.max_staleness > 0 the gap holds the policy's own updates since the batch was sampled."""
    gap = SamplerGap(0.1, tmp_path)
    for step in range(1, 5):
        gap.observe(step, {GAP_METRIC: 0.2, "rollout/staleness_max": 1.0})
    gap.observe(5, {GAP_METRIC: 0.2, "rollout/staleness_max": 0.0})  # a lag-0 batch is judged again
    with pytest.raises(TrainingError, match="step 6"):
        gap.observe(6, {GAP_METRIC: 0.2})


def test_a_dead_engine_mid_run_is_one_line_and_the_checkpoint_survives(tiny_model_dir, addition_jsonl, tmp_path,
                                                                       capsys, monkeypatch):
    real, calls = hf_mod.HFSampler.sample, []

    def dies_at_step_2(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise EngineDied("the vLLM engine died during sampling (EngineDeadError: EngineCore encountered an issue)")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(hf_mod.HFSampler, "sample", dies_at_step_2)
    out = tmp_path / "runs"
    code = main([
        "train", f"model.name_or_path={tiny_model_dir}", f"data.path={addition_jsonl(8)}",
        "reward.functions=[{name: exact_match}]", "rollout.num_generations=2", "rollout.max_completion_length=3",
        "train.prompts_per_step=2", "train.num_steps=3", "log.checkpoint_every=1", f"log.output_dir={out}",
        "log.run_name=r", "log.progress=false", "reward.dry_run_examples=0",
    ])  # fmt: skip
    assert code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("grpolab")]
    assert len(err) == 1 and err[0].startswith("grpolab: error: step 2: the vLLM engine died during sampling")
    assert "the last good checkpoint is" in err[0] and "step_1" in err[0] and "grpolab train --resume" in err[0]
    assert (out / "r" / "checkpoints" / "step_1").is_dir()
    assert not (out / "r" / "checkpoints" / "step_2").exists()
