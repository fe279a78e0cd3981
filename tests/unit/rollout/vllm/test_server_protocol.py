"""rollout/vllm/server_protocol.py: the checks of what a server says about the model it serves and what it loaded,
against the parameter lists of tiny models (what vllm_batch.served_weights reports for a config)."""

from __future__ import annotations

import pytest
import torch

from grpolab.rollout.vllm import server_protocol
from grpolab.rollout.vllm.batch import served_weights
from grpolab.rollout.vllm.server import RolloutServerError
from grpolab.rollout.vllm.sync import weight_metadata
from grpolab.tasks.tiny import build_char_tokenizer, build_tiny_model

URL = "http://127.0.0.1:8000"


def model(**kw):
    return build_tiny_model(build_char_tokenizer(), **{"hidden_size": 16, "num_layers": 1, "num_heads": 2, **kw})


def info_of(m, dtype="float32") -> dict:
    return {"dtype": dtype, "weights": served_weights(type("ModelConfig", (), {"hf_config": m.config})())}


def test_the_served_list_is_what_a_trainer_of_that_model_sends():
    m = model()
    sent = [(name, list(shape)) for name, _, shape in weight_metadata(m)]
    assert [tuple(w) for w in info_of(m)["weights"]] == sent and ("lm_head.weight", [80, 16]) in sent  # the tied head too
    server_protocol.check_model(URL, info_of(m), weight_metadata(m))


@pytest.mark.parametrize(
    ("trainer", "server", "says"),
    [
        ({}, {"num_layers": 2}, "its model has 'model.layers.1.self_attn.q_proj.weight' and 11 more parameters this trainer's lacks"),
        ({"num_layers": 2}, {}, "it has no parameter 'model.layers.1.self_attn.q_proj.weight' (12 of this trainer's 27"),
        ({}, {"hidden_size": 32}, "'model.embed_tokens.weight' is [80, 32] there and [80, 16] here"),
    ],
)
def test_another_model_is_one_line_naming_a_parameter(trainer, server, says):
    with pytest.raises(RolloutServerError) as err:
        server_protocol.check_model(URL, info_of(model(**server)), weight_metadata(model(**trainer)))
    message = str(err.value)
    assert message.startswith(f"the vLLM server at {URL} serves another model than this trainer's: ") and says in message
    assert "grpolab serve" in message and "\n" not in message


def test_the_dtype_sent_must_be_the_served_one_and_a_server_that_does_not_say_is_not_refused():
    m = model()
    with pytest.raises(RolloutServerError, match="serves bfloat16 weights, this trainer sends float32: set vllm.dtype=bfloat16"):
        server_protocol.check_model(URL, info_of(m, "bfloat16"), weight_metadata(m))
    server_protocol.check_model(URL, info_of(m, "bfloat16"), weight_metadata(m, torch.bfloat16))
    server_protocol.check_model(URL, {}, weight_metadata(m))  # a plain vllm serve: /grpolab/loaded is the check
    with pytest.raises(RolloutServerError, match=r"answered /grpolab/info with weights \[\['a', 'b'\]\], not a list of \[name, shape\]"):
        server_protocol.check_model(URL, {"weights": [["a", "b"]]}, weight_metadata(m))


def test_a_load_report_naming_parameters_is_one_line():
    server_protocol.check_loaded(URL, {"missing": []})
    server_protocol.check_loaded(URL, {"missing": None})  # a transport that does not track them (nccl)
    names = [f"model.layers.1.p{i}" for i in range(5)]
    with pytest.raises(RolloutServerError, match=r"into 5 of its parameters \(model.layers.1.p0, model.layers.1.p1, model.layers.1.p2, \.\.\.\)"):
        server_protocol.check_loaded(URL, {"missing": names})
    with pytest.raises(RolloutServerError, match="answered /grpolab/loaded with missing = 3, not a list of names"):
        server_protocol.check_loaded(URL, {"missing": 3})
