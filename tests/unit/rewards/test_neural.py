"""The neural reward model: batched scoring equals one-at-a-time, loading errors, step-prefix scores."""

from __future__ import annotations

import pytest
import torch

from grpolab.models.loading import ModelLoadError
from grpolab.rewards import build_reward, score_batch
from grpolab.rewards.neural import RewardModelSteps, load_classifier
from grpolab.types import Completion, Example


@pytest.fixture(scope="module")
def rm_dir(tiny_model_dir, tmp_path_factory) -> str:
    """The tiny causal LM with a new one-output head, saved as a reward model."""
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("rm")
    torch.manual_seed(0)
    load_classifier(tiny_model_dir, num_labels=1).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return str(out)


TEXTS = ["7", "12345", "", "99 bottles", "x"]


def test_batched_scores_equal_one_at_a_time(rm_dir):
    batched = build_reward("reward_model", kwargs={"path": rm_dir, "batch_size": 3}).reward
    single = build_reward("reward_model", kwargs={"path": rm_dir, "batch_size": 1}).reward
    comps, examples = [Completion(t, 1) for t in TEXTS], [Example(f"{i}+{i}=") for i in range(len(TEXTS))]
    # padded batches and single rows run different matmul shapes: equal to rounding, not bitwise (fp32:
    # a few ulps of the hidden-64 dot products; under bf16 autocast, where the CPU has it, bf16's 8 bits)
    tol = 1e-5 if batched.amp is None else 2e-2
    torch.testing.assert_close(
        torch.tensor(batched(comps, examples)), torch.tensor(single(comps, examples)), rtol=tol, atol=tol
    )
    assert len(set(batched(comps, examples))) == len(TEXTS)  # the score reads the text
    assert batched.num_parameters == sum(p.numel() for p in batched.model.parameters())
    result = score_batch(
        [build_reward("reward_model", kwargs={"path": rm_dir})], comps, examples, timeout_s=30.0
    )
    assert result.components["reward_model"] == pytest.approx(batched(comps, examples), rel=tol, abs=tol)


def test_step_prefixes_are_scored_as_prompt_plus_joined_steps(rm_dir):
    steps = RewardModelSteps(rm_dir, batch_size=2)
    outcome = build_reward("reward_model", kwargs={"path": rm_dir}).reward
    got = steps([["1,", "2,", "3"], ["9"]], [Example("p="), Example("q=")])
    want = outcome.score_texts(["p=1,", "p=1,2,", "p=1,2,3", "q=9"])
    assert [len(r) for r in got] == [3, 1]
    tol = 1e-5 if outcome.amp is None else 2e-2  # different batches: see test_batched_scores_...
    torch.testing.assert_close(torch.tensor(got[0] + got[1]), torch.tensor(want), rtol=tol, atol=tol)


def test_a_causal_lm_or_a_missing_folder_is_refused(tiny_model_dir, tmp_path):
    with pytest.raises(ModelLoadError, match="has 2 outputs; a reward model has one .*grpolab train-rm"):
        build_reward("reward_model", kwargs={"path": tiny_model_dir})
    with pytest.raises(
        ModelLoadError, match=r"reward model folder .*/nope does not exist: train one with `grpolab train-rm`"
    ):
        build_reward("reward_model", kwargs={"path": str(tmp_path / "nope")})
