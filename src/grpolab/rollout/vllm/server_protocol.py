"""What the sampler asks a vLLM server, and what it takes back from it, checked (rollout.mode=server;
docs/server_mode.md).

The requests: a step's batch for grpolab's batch route (rollout/vllm/batch.py parses it on the server),
or a seeded /v1/completions request per sample for a server without it.

The server is input, not a trusted part of the trainer: a sample it sends goes into the loss, so every
one is checked here (token ids of this model's vocabulary, at most the completion length asked, one
finite log-prob per token, the prompts and counts asked), and what it says about itself is checked at
the first sync (it takes weights by this trainer's transport; it serves this model: the parameters'
names and shapes, and the dtype) and after each (it loaded every parameter). Anything else is one
``RolloutServerError`` line naming the server and the route.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from grpolab.rollout.vllm import shm
from grpolab.rollout.vllm.batch import INFO_ROUTE, LOADED_ROUTE
from grpolab.rollout.vllm.server import RolloutServerError
from grpolab.rollout.vllm.server_client import bad_answer, shown

SAME_MODEL = (
    "start the server with this run's model (grpolab serve with the run's config), or point rollout.server_url "
    "at the server of this model"
)


def batch_request(model: str, prompts: list[list[int]], n: int, seed: int | None, sampling: dict) -> dict[str, Any]:
    """The body of grpolab's batch route: every prompt with ``n`` samples from one ``seed`` (rollout/vllm/batch.py);
    ``sampling``: temperature, top_p, top_k (-1: off), min_p, repetition_penalty, max_tokens, stop_token_ids."""
    return {"model": model, "prompts": [[int(t) for t in ids] for ids in prompts], "n": n, "seed": seed, "sampling": sampling}


def completion_request(model: str, ids: list[int], seed: int | None, sampling: dict) -> dict[str, Any]:
    """The body of one /v1/completions request: the token ids and the sampled token's log-prob come back."""
    body = {
        "model": model, "prompt": [int(t) for t in ids], **sampling,
        "logprobs": 0, "return_token_ids": True, "skip_special_tokens": False,  # the sampled token's log-prob only
    }  # fmt: skip
    if seed is not None:
        body["seed"] = seed
    return body


def sample(url: str, path: str, token_ids: Any, logprobs: Any, *, vocab_size: int, max_tokens: int) -> dict:
    """One completion, checked, as ``{"token_ids": [...], "logprobs": [...]}``."""
    if not isinstance(token_ids, list) or not all(type(t) is int for t in token_ids):
        raise bad_answer(url, path, f"token ids {shown(token_ids)}, not a list of integers")
    if len(token_ids) > max_tokens:
        raise bad_answer(
            url, path, f"a completion of {len(token_ids)} tokens, over the {max_tokens} asked (rollout.max_completion_length)"
        )
    outside = next((t for t in token_ids if not 0 <= t < vocab_size), None)
    if outside is not None:
        raise bad_answer(url, path, f"token id {outside}, outside this model's vocabulary (0..{vocab_size - 1})")
    if not isinstance(logprobs, list) or not all(type(x) in (int, float) for x in logprobs):
        raise bad_answer(url, path, f"log-probs {shown(logprobs)}, not a list of numbers")
    if len(logprobs) != len(token_ids):
        raise bad_answer(url, path, f"{len(logprobs)} log-probs for {len(token_ids)} tokens")
    bad = next((x for x in logprobs if not math.isfinite(x)), None)
    if bad is not None:
        raise bad_answer(url, path, f"a log-prob of {bad}, not a finite number")
    return {"token_ids": token_ids, "logprobs": [float(x) for x in logprobs]}


def batch_line(url: str, path: str, line: dict, *, prompts: int, per_prompt: int, seen, **limits) -> tuple[int, list[dict]]:
    """``(prompt, its samples)`` of one line of the batch route, checked: a prompt asked for and not sent yet
    (``seen``), with ``per_prompt`` samples; ``limits``: those of ``sample``."""
    p, samples = line.get("prompt"), line.get("samples")
    if type(p) is not int or not 0 <= p < prompts or p in seen:
        raise bad_answer(url, path, f"a line for prompt {shown(p)}: asked for prompts 0..{prompts - 1}, each once")
    if not isinstance(samples, list) or len(samples) != per_prompt:
        got = len(samples) if isinstance(samples, list) else shown(samples)
        raise bad_answer(url, path, f"{got} samples of prompt {p}, asked for {per_prompt}")
    out = []
    for s in samples:
        if not isinstance(s, dict):
            raise bad_answer(url, path, f"a sample {shown(s)}, not a JSON object")
        out.append(sample(url, path, s.get("token_ids"), s.get("logprobs"), **limits))
    return p, out


def completion(url: str, path: str, answer: dict, **limits) -> dict:
    """The one completion of a /v1/completions answer (``return_token_ids``, ``logprobs: 0``), checked."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise bad_answer(url, path, f"choices {shown(choices)}, not a list of completions")
    c = choices[0]
    logprobs = c.get("logprobs")
    if not isinstance(logprobs, dict):
        raise bad_answer(url, path, f"logprobs {shown(logprobs)}, not a JSON object")
    return sample(url, path, c.get("token_ids"), logprobs.get("token_logprobs"), **limits)


def check_transport(url: str, info: dict, transport: str) -> None:
    """The server takes weights over the transport this trainer sends them by (rollout.weight_transport on
    both sides: ``auto`` can differ, e.g. a grpolab serve bound to 0.0.0.0 and a trainer's loopback URL)."""
    served, mine = info.get("weight_transfer"), shm.BACKEND if transport == "shm" else "nccl"
    if served is not None and served != mine:
        raise RolloutServerError(
            f"the vLLM server at {url} takes weights over {served}, this trainer sends them over "
            f"{mine}: set rollout.weight_transport={'shm' if served == shm.BACKEND else served} for the "
            "trainer, or start the server with the trainer's"
        )


def check_model(url: str, info: dict, metadata: list[tuple[str, torch.dtype, tuple[int, ...]]]) -> None:
    """The server serves the model whose weights this trainer sends (``metadata``: rollout/vllm/sync.py's
    ``weight_metadata``): the same parameter names and shapes, in the dtype sent. A server that does not
    say (a plain vllm serve, an architecture transformers lacks) is checked by ``check_loaded`` alone."""
    weights = info.get("weights")
    if weights is None:
        return
    if not isinstance(weights, list) or not all(_is_entry(w) for w in weights):
        raise bad_answer(url, INFO_ROUTE, f"weights {shown(weights)}, not a list of [name, shape]")
    served = {name: tuple(shape) for name, shape in weights}
    mine = {name: tuple(shape) for name, _, shape in metadata}
    missing = [n for n in mine if n not in served]
    if missing:
        raise RolloutServerError(
            f"the vLLM server at {url} serves another model than this trainer's: it has no parameter {missing[0]!r} "
            f"({len(missing)} of this trainer's {len(mine)} are not there): {SAME_MODEL}"
        )
    extra = [n for n in served if n not in mine]
    if extra:
        raise RolloutServerError(
            f"the vLLM server at {url} serves another model than this trainer's: its model has {extra[0]!r} and "
            f"{len(extra) - 1} more parameters this trainer's lacks (it has {len(served)}, this trainer {len(mine)}): "
            f"{SAME_MODEL}"
        )
    other = next((n for n in mine if served[n] != mine[n]), None)
    if other is not None:
        raise RolloutServerError(
            f"the vLLM server at {url} serves another model than this trainer's: {other!r} is "
            f"{list(served[other])} there and {list(mine[other])} here: {SAME_MODEL}"
        )
    dtype, sent = info.get("dtype"), sorted({str(d).removeprefix("torch.") for _, d, _ in metadata})
    if isinstance(dtype, str) and sent and sent != [dtype]:
        raise RolloutServerError(
            f"the vLLM server at {url} serves {dtype} weights, this trainer sends {'/'.join(sent)}: set "
            f"vllm.dtype={dtype} for the trainer, or start the server with the trainer's vllm.dtype"
        )


def check_loaded(url: str, report: dict) -> None:
    """After a sync: the server loaded every parameter of its model (``/grpolab/loaded``; null: not tracked)."""
    missing = report.get("missing")
    if missing is None:
        return
    if not isinstance(missing, list) or not all(isinstance(n, str) for n in missing):
        raise bad_answer(url, LOADED_ROUTE, f"missing = {shown(missing)}, not a list of names")
    if missing:
        names = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        raise RolloutServerError(
            f"the vLLM server at {url} loaded none of this trainer's weights into {len(missing)} of its parameters "
            f"({names}), which keep their old values: it serves another model than this trainer's: {SAME_MODEL}"
        )


def _is_entry(w: Any) -> bool:
    return (
        isinstance(w, list) and len(w) == 2 and isinstance(w[0], str) and isinstance(w[1], list)
        and all(type(d) is int and d >= 0 for d in w[1])
    )  # fmt: skip
