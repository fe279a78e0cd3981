"""Sequence parallelism's checks, shares and masks, in one process (the collectives are tested on gloo in
tests/integration/test_sequence_parallel.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from grpolab.distributed import sequence
from grpolab.errors import ConfigError
from grpolab.models import ulysses_attention as ua


@pytest.mark.parametrize(
    ("n", "world", "launched", "says"),
    [
        (3, 4, True, "train.sequence_parallel=3 does not divide WORLD_SIZE=4"),
        (2, 1, False, "launch with torchrun --nproc_per_node 2"),
        (0, 1, False, "train.sequence_parallel=0 must be >= 1"),
    ],
)
def test_a_grid_that_cannot_be_made_is_one_line(n, world, launched, says):
    with pytest.raises(ConfigError, match=says) as err:
        sequence.check(n, world, launched=launched)
    assert "\n" not in str(err.value)


def test_a_grid_that_can_be_made_passes():
    sequence.check(2, 4, launched=True)
    sequence.check(1, 1, launched=False)


def test_each_rank_takes_its_slice_of_the_padded_length():
    assert sequence.padded_length(7, 2) == 8 and sequence.padded_length(8, 2) == 8 and sequence.padded_length(7, 3) == 9
    lay = sequence.Layout(size=3, rank=2)
    assert sequence.bounds(9, lay) == (6, 9)


def _tiny(heads: int, kv: int | None = None):
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=32, hidden_size=8 * heads, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=heads, num_key_value_heads=kv or heads, attn_implementation="sdpa")  # fmt: skip
    return AutoModelForCausalLM.from_config(config)


def test_a_model_whose_heads_do_not_divide_is_one_line():
    with pytest.raises(ConfigError, match=r"has 6 attention heads, which do not divide by 4") as err:
        ua.install(_tiny(6), 4)
    assert "\n" not in str(err.value)


class OwnAttention(nn.Module):
    """Attention computed in the layer itself, as remote code often is: no lookup in transformers' registry
    (transformers reads this module's source to tell)."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)


def _own_attention_model():
    from transformers import PretrainedConfig, PreTrainedModel

    class OwnModel(PreTrainedModel):
        config_class = PretrainedConfig

        def __init__(self, config):
            super().__init__(config)
            self.attention = OwnAttention()

    return OwnModel(PretrainedConfig(num_attention_heads=4))


def test_a_model_whose_attention_skips_the_registry_is_one_line():
    with pytest.raises(ConfigError, match=r"OwnModel does not use transformers' attention-function registry") as err:
        ua.install(_own_attention_model(), 2)
    assert "\n" not in str(err.value) and "train.sequence_parallel=1" in str(err.value)


def test_a_model_with_sliding_window_layers_is_one_line():
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                         use_sliding_window=True, sliding_window=4, max_window_layers=1, attn_implementation="sdpa")  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    assert "sliding_attention" in model.config.layer_types
    with pytest.raises(ConfigError, match=r"has sliding-window layers") as err:
        ua.install(model, 2)
    assert "\n" not in str(err.value)


def test_install_switches_the_attention_to_the_registered_function():
    from transformers import AttentionInterface

    model = _tiny(4, kv=1)  # one key / value head: repeated to the query heads before the split
    ua.install(model, 2)
    assert model.config._attn_implementation == "grpolab_ulysses_sdpa"
    assert AttentionInterface()["grpolab_ulysses_sdpa"] is ua.ulysses_attention


def test_an_unsplit_forward_through_the_function_is_the_inner_attention():
    """Generation runs the installed model whole: the function then is sdpa itself."""
    torch.manual_seed(0)
    plain = _tiny(4)
    installed = _tiny(4)
    installed.load_state_dict(plain.state_dict())
    ua.install(installed, 2)
    ids = torch.tensor([[0, 5, 6, 7], [3, 4, 5, 6]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    torch.testing.assert_close(installed(input_ids=ids, attention_mask=mask).logits, plain(input_ids=ids, attention_mask=mask).logits)


def test_the_packed_mask_keeps_each_row_to_itself():
    positions = torch.tensor([[0, 1, 2, 0, 1]])  # two rows packed: 3 tokens, then 2
    got = ua.full_mask(positions, None)[0, 0].int()
    want = torch.tensor(
        [[1, 0, 0, 0, 0],
         [1, 1, 0, 0, 0],
         [1, 1, 1, 0, 0],
         [0, 0, 0, 1, 0],
         [0, 0, 0, 1, 1]]
    )  # fmt: skip
    assert torch.equal(got, want)
    assert ua.full_mask(torch.tensor([[0, 1, 2]]), None) is None  # one row: plainly causal


def test_the_padded_mask_hides_pads_and_lets_a_pad_see_itself():
    positions = torch.tensor([[0, 0, 1, 2]])
    got = ua.full_mask(positions, torch.tensor([[0, 1, 1, 0]]))[0, 0].int()
    want = torch.tensor(
        [[1, 0, 0, 0],
         [0, 1, 0, 0],
         [0, 1, 1, 0],
         [0, 1, 1, 1]]
    )  # fmt: skip
    assert torch.equal(got, want)


def test_the_end_pad_of_a_plainly_causal_micro_batch_builds_no_mask(monkeypatch):
    """An odd length padded to a multiple of N: the pad comes last, so causal attention alone keeps it out
    and no [S, S] mask is made (at 32K it cost 1 GiB of bool and 4 GiB of sdpa's float per layer); a packed
    micro-batch of two rows still gets its whole mask over the padded length."""
    monkeypatch.setattr(sequence, "_LAYOUT", sequence.Layout(2, 1, None))
    ids, keep = torch.arange(7)[None], torch.arange(3, 7)
    for attention_mask in (None, torch.ones(1, 7, dtype=torch.long)):
        local = ua.split(ids, torch.arange(7)[None], attention_mask, keep)
        assert local.shard.mask is None and local.input_ids.tolist() == [[4, 5, 6, 0]]
        assert local.keep.tolist() == [0, 1, 2] and local.mine.tolist() == [False, True, True, True]
    packed = ua.split(ids, torch.tensor([[0, 1, 2, 0, 1, 2, 3]]), None, keep)
    assert packed.shard.mask.shape == (1, 1, 8, 8) and not bool(packed.shard.mask[0, 0, 3, 2])
    padded = ua.split(ids, torch.arange(7)[None], torch.tensor([[0, 1, 1, 1, 1, 1, 1]]), keep)
    assert padded.shard.mask.shape == (1, 1, 8, 8) and not bool(padded.shard.mask[0, 0, 7, 0])


def test_the_config_refuses_a_background_sampler_beside_sequence_parallelism():
    from grpolab.config import load_config

    with pytest.raises(ConfigError, match="set rollout.max_staleness=0"):
        load_config(None, ["train.sequence_parallel=2", "rollout.max_staleness=1"])
    with pytest.raises(ConfigError, match="train.sequence_parallel must be >= 1"):
        load_config(None, ["train.sequence_parallel=0"])
    assert load_config(None, ["train.sequence_parallel=2"]).train.sequence_parallel == 2
