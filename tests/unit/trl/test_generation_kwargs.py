"""TRL's generation_kwargs (grpolab.trl.generation): what only shapes the draw becomes rollout.*, over TRL's own
fields as TRL lets it; what grpolab's sampler cannot reproduce is refused, each key named with the reason."""

import json

import pytest

from grpolab.config import ConfigError
from grpolab.trl.convert import convert_trl

pytest.importorskip("trl")


def rollout(**trl_values):
    return {k: v for k, v in convert_trl(trl_values).keys.items() if k.startswith("rollout.")}


def test_the_draw_only_keys_override_trls_fields_as_in_trl():
    # TRL: generation_kwargs updates the dict built from top_k=10 etc., so 50 wins
    kwargs = {"do_sample": True, "top_k": 50, "top_p": 0.9, "min_p": 0.05, "repetition_penalty": 1.1,
              "use_cache": True, "temperature": 0.7, "max_new_tokens": 64}  # fmt: skip
    got = rollout(top_k=10, top_p=0.5, temperature=0.7, max_completion_length=64, generation_kwargs=kwargs)
    assert (got["rollout.top_k"], got["rollout.top_p"], got["rollout.min_p"]) == (50, 0.9, 0.05)
    assert (got["rollout.repetition_penalty"], got["rollout.temperature"], got["rollout.max_completion_length"]) == (1.1, 0.7, 64)
    assert rollout(generation_kwargs=json.dumps({"top_k": 3}))["rollout.top_k"] == 3  # TRL's JSON-string form
    assert rollout(top_k=10, generation_kwargs={})["rollout.top_k"] == 10


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"do_sample": True, "top_k": 50, "num_beams": 2, "length_penalty": -0.1},  # TRL's own test
         r"generation_kwargs\['num_beams'\], generation_kwargs\['length_penalty'\]: beam search"),
        ({"temperature": 0.7}, r"generation_kwargs\['temperature'\]=0.7 differs from temperature=1.0: TRL would sample "
         r"with 0.7 but take its log-probs at temperature=1.0.*set temperature=0.7 instead"),
        ({"max_new_tokens": 8}, r"differs from max_completion_length=512.*set max_completion_length=8 instead"),
        ({"do_sample": False}, r"generation_kwargs\['do_sample'\]=False decodes greedily"),
        ({"suppress_tokens": [1], "top_k": 4}, r"generation_kwargs\['suppress_tokens'\]: not an option of grpolab's sampler"),
        ({"top_k": None}, r"generation_kwargs\['top_k'\]=None: give a number \(rollout.top_k\)"),
    ],
)  # fmt: skip
def test_what_the_sampler_cannot_reproduce_is_refused_in_one_line_naming_the_key(kwargs, message):
    with pytest.raises(ConfigError, match=r"convert-trl: grpolab cannot reproduce generation_kwargs=.*" + message) as err:
        convert_trl({"generation_kwargs": kwargs})
    assert "\n" not in str(err.value)
