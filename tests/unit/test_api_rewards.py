"""TRL's reward_processing_classes: the tokenizer of a reward model given as a name, as an object or a folder."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from grpolab.api import GRPOTrainer
from grpolab.errors import ConfigError
from grpolab.rewards.neural import load_classifier

ROWS = [{"prompt": "1+1="}, {"prompt": "2+2="}]


@pytest.fixture(scope="module")
def bare_rm_dir(tiny_model_dir, tmp_path_factory) -> str:
    """A reward model folder with weights and no tokenizer files, as a head trained elsewhere may be saved."""
    out = tmp_path_factory.mktemp("bare_rm")
    torch.manual_seed(0)
    load_classifier(tiny_model_dir, num_labels=1).save_pretrained(out)
    return str(out)


def test_a_reward_models_tokenizer_is_given_as_an_object(tiny_model_dir, bare_rm_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    without = GRPOTrainer(tiny_model_dir, bare_rm_dir, train_dataset=ROWS).rewards[0].reward
    assert without.tokenizer.get_vocab() != tokenizer.get_vocab()  # the folder's (transformers makes an empty one)
    trainer = GRPOTrainer(tiny_model_dir, bare_rm_dir, train_dataset=ROWS, reward_processing_classes=tokenizer)
    scorer = trainer.rewards[0].reward
    assert scorer.tokenizer.get_vocab() == tokenizer.get_vocab()
    assert trainer.reward_processing_classes == [tokenizer]  # TRL's attribute: the object given
    assert trainer.reward_funcs == [scorer.model]  # TRL's attribute: a reward model's id, loaded
    (spec,) = trainer.args.reward.functions
    assert spec.name == "reward_model" and spec.kwargs["path"] == bare_rm_dir  # config.yaml says what ran
    assert AutoTokenizer.from_pretrained(spec.kwargs["tokenizer"]).get_vocab() == tokenizer.get_vocab()


def test_a_folder_goes_into_the_config_and_a_functions_entry_is_not_read(tiny_model_dir, bare_rm_dir):
    def constant(completions, **kwargs):
        return [1.0] * len(completions)

    trainer = GRPOTrainer(
        tiny_model_dir, [constant, bare_rm_dir], train_dataset=ROWS,
        reward_processing_classes=["not read, as in TRL", tiny_model_dir],
    )  # fmt: skip
    assert [s.kwargs.get("tokenizer") for s in trainer.args.reward.functions] == [None, tiny_model_dir]
    assert trainer.reward_processing_classes == ["not read, as in TRL", tiny_model_dir]
    assert trainer.reward_funcs[0] is constant and trainer.reward_funcs[1] is trainer.rewards[1].reward.model
    assert GRPOTrainer(tiny_model_dir, [constant, "r1_format"], train_dataset=ROWS).reward_processing_classes == [None, None]


def test_one_entry_per_reward(tiny_model_dir, bare_rm_dir):
    with pytest.raises(ConfigError, match="reward_processing_classes has 2 entries for 1 reward_funcs: the lengths must match"):
        GRPOTrainer(tiny_model_dir, bare_rm_dir, train_dataset=ROWS, reward_processing_classes=[None, None])


def test_a_loaded_reward_model_is_a_reward_model_as_in_trl(tiny_model_dir, bare_rm_dir):
    """TRL takes reward_funcs=AutoModelForSequenceClassification.from_pretrained(...): written to a folder the
    trainer owns, scored as a reward model given by path, with the tokenizer given for it."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(bare_rm_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    trainer = GRPOTrainer(tiny_model_dir, model, train_dataset=ROWS, reward_processing_classes=tokenizer)
    (spec,) = trainer.args.reward.functions
    assert spec.name == "reward_model" and spec.kwargs["path"] != bare_rm_dir  # the trainer's copy
    scorer = trainer.rewards[0].reward
    assert scorer.tokenizer.get_vocab() == tokenizer.get_vocab()
    assert trainer.reward_funcs[0] is model  # TRL's attribute: the object given; grpolab scores with its copy
    for name, weight in model.named_parameters():  # the very weights given
        torch.testing.assert_close(scorer.model.get_parameter(name), weight, rtol=0, atol=0)


def test_two_reward_models_are_named_after_their_folders_as_in_trl(tiny_model_dir, bare_rm_dir, tmp_path):
    other = tmp_path / "other-rm"
    load_classifier(tiny_model_dir, num_labels=1).save_pretrained(other)
    trainer = GRPOTrainer(tiny_model_dir, [bare_rm_dir, str(other)], train_dataset=ROWS,
                          reward_processing_classes=[tiny_model_dir, tiny_model_dir])  # fmt: skip
    assert trainer.reward_func_names == [bare_rm_dir.rstrip("/").split("/")[-1], "other-rm"]
    assert [s.alias for s in trainer.args.reward.functions] == trainer.reward_func_names


def test_a_reward_functions_entry_as_a_dict_is_a_reward():
    from grpolab.api_rewards import build_reward_funcs, recorded_spec

    entry = {"name": "exact_match", "alias": "em", "weight": 5.0}  # its weight is reward_weights', as for any reward
    (built,) = build_reward_funcs(entry, [2.0])
    assert (built.name, built.weight) == ("em", 2.0)
    assert recorded_spec(entry, built) == {"name": "exact_match", "alias": "em", "weight": 2.0}
