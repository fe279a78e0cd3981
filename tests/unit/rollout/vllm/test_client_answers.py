"""The server sampler (rollout/vllm/client.py) against a stub server (tests/unit/rollout/vllm/server_stubs.py)
that sends samples of the wrong shape, or serves another model: each is one RolloutServerError line
naming the server, before anything reaches the trainer (or, for another model, before any weight is sent)."""

from __future__ import annotations

import logging

import pytest
import torch
from server_stubs import StubServer, ndjson

from grpolab.rollout.vllm.batch import served_weights
from grpolab.rollout.vllm.client import ServerSampler
from grpolab.rollout.vllm.server import RolloutServerError
from grpolab.rollout.vllm.server_client import ServerClient
from grpolab.tasks.tiny import build_tiny_model

INFO = {"protocol": 1, "weight_transfer": "grpolab_shm", "dtype": "float32", "weights": None}
GOOD = {"token_ids": [5, 6], "logprobs": [-0.5, -1.25]}


@pytest.fixture
def stub():
    made: list[StubServer] = []

    def make(routes) -> StubServer:
        made.append(StubServer({("GET", "/weight_info"): (200, {"weight_version": "0"}), **routes}))
        return made[-1]

    yield make
    for server in made:
        server.close()


def sampler(url, tok, *, max_tokens=4, weights_from=None) -> ServerSampler:
    s = ServerSampler(ServerClient(url, timeout_s=10), tok, max_completion_length=max_tokens, eos_token_ids=[tok.eos_token_id],
                      weights_from=weights_from)  # fmt: skip
    if weights_from is None:
        s.version = 0  # as after the first sync
    return s


def test_a_well_formed_batch_becomes_the_completions_it_says(stub, tok):
    server = stub({("GET", "/grpolab/info"): (200, INFO),
                   ("POST", "/grpolab/generate"): (200, ndjson({"queued": True}, {"prompt": 1, "samples": [GOOD, GOOD]},
                                                              {"prompt": 0, "samples": [GOOD, {"token_ids": [7], "logprobs": [-2]}]},
                                                              {"done": 2}))})  # fmt: skip
    out = sampler(server.url, tok).sample([[5], [6, 7]], num_generations=2)
    assert out.completion_ids.tolist() == [[5, 6], [7, 0], [5, 6], [5, 6]]  # prompt-major; 0 = the pad id
    assert out.logprobs[out.completion_mask].tolist() == [-0.5, -1.25, -2.0, -0.5, -1.25, -0.5, -1.25]


def _failed(out) -> str:
    """The one message of a sample call whose every sample failed as an engine error: a bad answer is a failed
    sample (its group dropped, counted, the run stopped over train.max_failed_group_share), never trained on."""
    assert out.failures is not None and all(f is not None and f.kind == "engine_error" for f in out.failures)
    [message] = {f.message for f in out.failures}
    return message


@pytest.mark.parametrize(
    ("samples", "says"),
    [
        ([{"token_ids": [5, 80], "logprobs": [-1, -1]}] * 2, "token id 80, outside this model's vocabulary (0..79)"),
        ([{"token_ids": [5, -1], "logprobs": [-1, -1]}] * 2, "token id -1, outside"),
        ([{"token_ids": [5] * 5, "logprobs": [-1] * 5}] * 2, "a completion of 5 tokens, over the 4 asked (rollout.max_completion_length)"),
        ([{"token_ids": [5, 6, 7], "logprobs": [-1, -1]}] * 2, "2 log-probs for 3 tokens"),
        ([{"token_ids": [5, 6], "logprobs": [-1, float("nan")]}] * 2, "a log-prob of nan, not a finite number"),
        ([{"token_ids": [5, 6], "logprobs": [-1, float("-inf")]}] * 2, "a log-prob of -inf, not a finite number"),
        ([{"token_ids": "56", "logprobs": [-1, -1]}] * 2, "token ids 56, not a list of integers"),
        ([{"token_ids": [5, True], "logprobs": [-1, -1]}] * 2, "token ids [5, True], not a list of integers"),
        ([{"token_ids": [5, 6], "logprobs": ["-1", -1]}] * 2, "not a list of numbers"),
        ([{"logprobs": [-1]}] * 2, "token ids None, not a list of integers"),
        ([GOOD], "1 samples of prompt 0, asked for 2"),
        (None, "None samples of prompt 0"),
        (["x", "y"], "a sample x, not a JSON object"),
    ],
)
def test_a_sample_of_the_wrong_shape_is_one_line(stub, tok, samples, says):
    server = stub({("GET", "/grpolab/info"): (200, INFO),
                   ("POST", "/grpolab/generate"): (200, ndjson({"prompt": 0, "samples": samples}, {"done": 1}))})  # fmt: skip
    message = _failed(sampler(server.url, tok).sample([[5]], num_generations=2))
    assert says in message and f"the vLLM server at {server.url} answered /grpolab/generate with" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("lines", "says"),
    [
        ([{"prompt": 3, "samples": [GOOD, GOOD]}], "a line for prompt 3: asked for prompts 0..0, each once"),
        ([{"prompt": "0", "samples": [GOOD, GOOD]}], "a line for prompt 0: asked"),
        ([{"done": 1}], "returned 0 of 1 prompts' samples"),
        ([], "returned 0 of 1 prompts' samples"),  # the stream ends without a word
    ],
)
def test_a_batch_other_than_asked_is_one_line(stub, tok, lines, says):
    server = stub({("GET", "/grpolab/info"): (200, INFO), ("POST", "/grpolab/generate"): (200, ndjson(*lines))})
    message = _failed(sampler(server.url, tok).sample([[5]], num_generations=2))
    assert message.startswith("the vLLM server at ") and says in message


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ({"choices": [{"token_ids": [5, 99], "logprobs": {"token_logprobs": [-1, -1]}}]}, "token id 99, outside"),
        ({"choices": [{"token_ids": [5, 6], "logprobs": None}]}, "logprobs None, not a JSON object"),
        ({"choices": []}, "choices [], not a list of completions"),
        ({"id": "cmpl-1"}, "choices None, not a list of completions"),
        ([1, 2], "[1, 2], not a JSON object"),
    ],
)
def test_a_plain_servers_completion_of_the_wrong_shape_is_one_line(stub, tok, answer, says):
    """A server without grpolab's routes (a plain vllm serve): a /v1/completions request per sample."""
    server = stub({("POST", "/v1/completions"): (200, answer)})  # /grpolab/info: 404
    s = sampler(server.url, tok)
    message = _failed(s.sample([[5]], num_generations=1))
    assert not s.batched and "answered /v1/completions with" in message and says in message


def test_a_line_after_every_prompt_came_back_is_a_warning(stub, tok, caplog):
    """The batch's samples had all come back, checked, before the stray line: they are kept; the line is said."""
    lines = [{"prompt": 0, "samples": [GOOD, GOOD]}] * 2
    server = stub({("GET", "/grpolab/info"): (200, INFO), ("POST", "/grpolab/generate"): (200, ndjson(*lines))})
    with caplog.at_level(logging.WARNING, logger="grpolab.rollout.vllm.client"):
        out = sampler(server.url, tok).sample([[5]], num_generations=2)
    assert out.failures is None and out.completion_ids.shape[0] == 2
    assert "a line for prompt 0: asked for prompts 0..0, each once" in caplog.text


def test_a_server_of_another_kind_is_one_line_not_a_fall_back(stub, tok):
    """An HTML page on every route (200): not a plain vLLM server (that answers 404 to grpolab's routes)."""
    page = b"<html><body>Welcome</body></html>"
    server = stub({("GET", "/weight_info"): (200, page), ("GET", "/grpolab/info"): (200, page)})
    with pytest.raises(RolloutServerError, match=r"answered /weight_info with <html><body>Welcome</body></html>, not a JSON object"):
        sampler(server.url, tok).sample([[5]], num_generations=1)


def test_a_trainer_of_another_model_is_refused_at_its_first_sync_before_any_weight_goes(stub, tok):
    """The reported case: a 1-layer trainer against the server of a 2-layer model of the same vocabulary
    and width trained on that server's samples. The server's /grpolab/info lists its model's parameters."""
    served = build_tiny_model(tok, hidden_size=16, num_layers=2, num_heads=2)
    info = {**INFO, "weights": served_weights(type("ModelConfig", (), {"hf_config": served.config})())}
    server = stub({("GET", "/grpolab/info"): (200, info), ("POST", "/pause?mode=wait"): (200, {})})
    trainer = build_tiny_model(tok, hidden_size=16, num_layers=1, num_heads=2)
    with pytest.raises(RolloutServerError) as err:
        sampler(server.url, tok, weights_from=trainer).sample([[5]], num_generations=1)
    assert f"the vLLM server at {server.url} serves another model than this trainer's: its model has " in str(err.value)
    assert "'model.layers.1." in str(err.value) and "\n" not in str(err.value)
    assert [(m, p) for m, p, _ in server.asked] == [("GET", "/grpolab/info")]  # no /pause, no weights

    server.asked.clear()  # the same model passes the check and is sent
    same = sampler(server.url, tok, weights_from=served)
    with pytest.raises(RolloutServerError, match="/start_weight_update with 404"):  # the stub has no weight routes
        same.sample([[5]], num_generations=1)
    assert [p for _, p, _ in server.asked][:2] == ["/grpolab/info", "/pause?mode=wait"]


def test_a_failed_weight_load_stops_the_sync_in_one_line(stub, tok):
    """The server reports the parameters its update left out (/grpolab/loaded): never ignored."""
    model = build_tiny_model(tok, hidden_size=16, num_layers=1, num_heads=2)
    ok = {("POST", r): (200, {}) for r in ("/pause?mode=wait", "/start_weight_update", "/init_weight_transfer_engine",
                                           "/update_weights", "/finish_weight_update", "/reset_prefix_cache", "/resume")}  # fmt: skip
    missing = ["model.layers.1.mlp.down_proj.weight", "model.layers.1.mlp.gate_up_proj.weight"]
    server = stub({("GET", "/grpolab/info"): (200, INFO), ("GET", "/grpolab/loaded"): (200, {"missing": missing}), **ok})
    s = sampler(server.url, tok, weights_from=model, max_tokens=2)
    with pytest.raises(RolloutServerError) as err:
        s.update_weights(model)
    assert str(err.value).startswith(
        f"the vLLM server at {server.url} loaded none of this trainer's weights into 2 of its parameters "
        "(model.layers.1.mlp.down_proj.weight, model.layers.1.mlp.gate_up_proj.weight)"
    )
    assert [p for _, p, _ in server.asked][-2:] == ["/grpolab/loaded", "/resume"]  # the server is resumed all the same
    assert s.version is None  # no version counts as sent
    s.close()


def test_the_dtype_served_must_be_the_one_sent(stub, tok):
    model = build_tiny_model(tok, hidden_size=16, num_layers=1, num_heads=2)
    info = {**INFO, "dtype": "float32", "weights": [[n, list(p.shape)] for n, p in model.named_parameters(remove_duplicate=False)]}
    server = stub({("GET", "/grpolab/info"): (200, info)})
    s = ServerSampler(ServerClient(server.url, timeout_s=10), tok, max_completion_length=2, eos_token_ids=[2],
                      dtype=torch.bfloat16)  # fmt: skip
    with pytest.raises(RolloutServerError, match=r"serves float32 weights, this trainer sends bfloat16: set vllm.dtype=float32"):
        s.update_weights(model)
