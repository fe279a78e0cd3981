"""Process supervision in the trainer: step ends from token ids, and the advantages that reach the loss."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from grpolab.config import ConfigError, load_config
from grpolab.rewards.step_rewards import per_step
from grpolab.runtime.step_spec import batch_builder
from grpolab.tasks.tiny import build_char_tokenizer
from grpolab.training.reasoning_steps import ProcessSupervision, StepSplitter
from grpolab.types import Completions, Example


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def completions(tok, texts: list[str], width: int, group: int) -> Completions:
    """Right-padded ids of each text followed by EOS (as a sampler returns them)."""
    rows = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    ids = torch.full((len(rows), width), tok.pad_token_id)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), True
    return Completions(
        prompt_ids=[[tok.bos_token_id]] * len(rows),
        completion_ids=ids,
        completion_mask=mask,
        logprobs=torch.zeros(ids.shape),
        texts=texts,
        finish_reasons=["stop"] * len(rows),
        num_generations=group,
    )


def ends(splitter, tok, text: str) -> list[int]:
    return splitter.ends(tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])


def test_one_token_delimiter_and_the_final_step(tok):
    s = StepSplitter(tok, ",")
    assert ends(s, tok, "12,3") == [2, 4]  # "12," ends at ","; "3"+EOS ends at EOS
    assert ends(s, tok, "12,") == [3]  # EOS alone joins the last step: no empty step
    assert ends(s, tok, "7") == [1]
    end_mask, steps = s.split(
        completions(tok, ["1,2,", "ab"], 6, 2).completion_ids,
        completions(tok, ["1,2,", "ab"], 6, 2).completion_mask,
    )
    assert steps == [["1,", "2,"], ["ab"]]
    assert end_mask.tolist() == [
        [False, True, False, False, True, False],
        [False, False, True, False, False, False],
    ]


def test_multi_token_delimiter_matches_id_sequences_without_overlap(tok):
    s = StepSplitter(tok, ", ")
    assert s.pattern == tuple(tok(", ", add_special_tokens=False)["input_ids"]) and len(s.pattern) == 2
    assert ends(s, tok, "1, 2, 3") == [2, 5, 7]
    assert ends(StepSplitter(tok, "aa"), tok, "aaa") == [
        1,
        3,
    ]  # "aa" then "a"+EOS; the overlap at 2 is not a match


def test_one_token_delimiter_inside_merged_tokens():
    """BPE vocabularies hold tokens such as ".\\n": a step ends at any token whose text contains the delimiter."""
    vocab = {"<unk>": 0, "<eos>": 1, "a": 2, ",": 3, "b,": 4, "c": 5}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.Fuse()
    bpe = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>")
    s = StepSplitter(bpe, ",")
    assert s.end_ids == {3, 4}
    assert s.ends([2, 4, 5, 1]) == [1, 3]


def test_a_delimiter_the_tokenizer_cannot_write_is_a_config_error(tok):
    with pytest.raises(ConfigError, match=r"delimiter '\\n' encodes to \[3\].*unknown token"):
        StepSplitter(tok, "\n")


def test_process_advantages_reaching_the_loss_match_hand_numbers(tok):
    """P=1, G=2. Completion 0 = "1,2" + EOS: steps "1," (reward 1, ends t=1) and "2" (reward 0, ends t=3).
    Completion 1 = "3" + EOS: one step "3" (reward 1, ends t=1), then padding.

    All steps of the group: R = [1, 0, 1], mean 2/3, unbiased std sqrt(1/3), eps 1e-4:
    r~ = (1/3)/(0.57735+1e-4) = 0.5772503 for a reward of 1, (-2/3)/(0.57735+1e-4) = -1.1545006 for 0.
    Token advantage = sum of r~ of the steps ending at or after it:
    row 0: t0, t1 -> 0.5772503 - 1.1545006 = -0.5772503; t2, t3 -> -1.1545006.  row 1: t0, t1 -> 0.5772503.
    """
    cfg = load_config(
        None,
        [
            "algo.beta=0",
            "algo.supervision=process",
            "reward.process={name: 'unused:rule', delimiter: ','}",
            "rollout.num_generations=2",
        ],
    )
    odd_digit = per_step(lambda steps, example: [float(int(s[0]) % 2) for s in steps], name="odd")
    comps = completions(tok, ["1,2", "3"], 4, 2)
    step_rewards = ProcessSupervision(StepSplitter(tok, ","), odd_digit, timeout_s=None).score(
        comps, [Example("q")] * 2
    )
    assert step_rewards.step_end_mask.tolist() == [[False, True, False, True], [False, True, False, False]]
    assert step_rewards.step_rewards.tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]
    batch, metrics = batch_builder(cfg, None, None)(
        comps,
        [[tok.bos_token_id]],
        torch.zeros(1, 2),
        torch.ones(1, 2, dtype=torch.bool),
        policy=None,
        reference=None,
        steps=step_rewards,
    )
    expected = torch.tensor(
        [[-0.5772503, -0.5772503, -1.1545006, -1.1545006], [0.5772503, 0.5772503, 0.0, 0.0]]
    )
    torch.testing.assert_close(batch.advantages, expected, rtol=0, atol=1e-6)
    assert metrics["rollout/steps_mean"] == 1.5 and metrics["train/step_reward_mean"] == pytest.approx(2 / 3)
    # outcome supervision on the same batch: one value along T (rewards all 0 here, so all 0)
    outcome, _ = batch_builder(cfg, None, None)(
        comps, [[tok.bos_token_id]], torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool), policy=None, reference=None
    )
    assert not outcome.advantages.any()


def test_process_supervision_needs_a_process_reward_and_grpo():
    with pytest.raises(ConfigError, match="needs reward.process"):
        load_config(None, ["algo.supervision=process"])
    with pytest.raises(ConfigError, match="algo.name=grpo"):
        load_config(None, ["algo.supervision=process", "reward.process={name: a:b}", "algo.name=rloo"])


def test_turns_are_the_steps_of_an_episode():
    """2 episodes x 2 turns, G = 2, by hand. Layout (m = model token, e = env token, . = pad):
    A: m m e e m m .  turn rewards (0, 1), other reward functions add 0.5: total 1.5, steps (0, 1.5)
    B: m m m e e m m  turn rewards (0.5, none), others add 0: total 0.5, steps (0.5, 0)
    Steps of the group: 0, 1.5, 0.5, 0; mean 0.5, unbiased std sqrt(1.5 / 3); a token's advantage is the
    sum of the normalised rewards of the steps ending at or after it; env tokens get none."""
    from grpolab.runtime.step_spec import process_supervision
    from grpolab.training.reasoning_steps import TurnSupervision
    from grpolab.types import Episode

    cfg = load_config(
        None,
        [
            "env.name=calculator", "env.kwargs={call_format: python}", "algo.supervision=process",
            "reward.functions=[{name: env}, {name: 'toy:other', weight: 0.5}]",
        ],
    )  # fmt: skip
    process = process_supervision(cfg, None, [])
    assert isinstance(process, TurnSupervision) and process.env_weight == 1.0
    m, e = True, False
    sampled = torch.tensor([[m, m, e, e, m, m, False], [m, m, m, e, e, m, m]])
    comps = Completions(
        prompt_ids=[[1], [1]],
        completion_ids=torch.full((2, 7), 5),
        completion_mask=torch.tensor([[True] * 6 + [False], [True] * 7]),
        logprobs=torch.zeros(2, 7),
        texts=["a", "b"],
        finish_reasons=["stop", "stop"],
        num_generations=2,
        sampled_mask=sampled,
        episodes=[
            Episode((), 1.0, 2, turn_ends=(1, 5), turn_rewards=(0.0, 1.0)),
            Episode((), 0.5, 2, turn_ends=(2, 6), turn_rewards=(0.5, None)),
        ],
    )
    totals = torch.tensor([[1.5, 0.5]])
    steps = process.score(comps, [Example("q")] * 2, totals, torch.ones(1, 2, dtype=torch.bool))
    assert steps.step_end_mask.nonzero().tolist() == [[0, 1], [0, 5], [1, 2], [1, 6]]
    assert steps.step_rewards[steps.step_end_mask].tolist() == [0.0, 1.5, 0.5, 0.0]
    batch, metrics = batch_builder(cfg, None, None)(
        comps, [[1]], totals, torch.ones(1, 2, dtype=torch.bool), policy=None, reference=None, steps=steps
    )
    s = 0.5**0.5 + cfg.algo.eps  # std of (-0.5, 1, 0, -0.5) over 3, plus eps
    a1, a2, b1, b2 = -0.5 / s, 1.0 / s, 0.0 / s, -0.5 / s  # the normalised step rewards
    expected = torch.tensor(
        [
            [a1 + a2, a1 + a2, 0, 0, a2, a2, 0],
            [b1 + b2, b1 + b2, b1 + b2, 0, 0, b2, b2],
        ]
    )
    assert cfg.algo.std == "unbiased"
    torch.testing.assert_close(batch.advantages, expected, rtol=0, atol=1e-6)
    assert not batch.advantages[~sampled].any() and not batch.loss_mask[~sampled].any()
    assert metrics["rollout/steps_mean"] == 2.0 and metrics["train/step_reward_mean"] == pytest.approx(0.5)
    # an episode without a valid reward has no steps: it gets no advantage and the group has B's steps only
    invalid = process.score(comps, [Example("q")] * 2, totals, torch.tensor([[False, True]]))
    assert invalid.step_end_mask.nonzero().tolist() == [[1, 2], [1, 6]]
