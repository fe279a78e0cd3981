"""TRL's ``generation_kwargs``: the keys grpolab's sampler reproduces become rollout.* keys, the others are
refused, each named with the reason.

TRL 1.16 (GRPOTrainer.__init__) builds its sampling settings from its own fields, then updates them with
``generation_kwargs`` ("keys that conflict ... override them"), and passes the result to transformers'
``GenerationConfig`` (or vLLM's ``SamplingParams``). So a key here wins over TRL's field of the same name, as
the table applies this field after those (grpolab.trl.fields). What grpolab can take is what only shapes the
draw of each token, for which the training log-probs stay those of softmax(logits / T), as TRL computes them:
top_k, top_p, min_p, repetition_penalty. The temperature and the length are also used by TRL outside the
sampler (its log-probs are taken at ``temperature``, dr_grpo divides by ``max_completion_length``), so a
value there is taken only where it equals TRL's field: a different one would sample with one setting and
train with the other, which grpolab does not do.
"""

from __future__ import annotations

import json
from typing import Any

from grpolab.trl.kinds import Refused

DRAW_ONLY = {"top_k": "rollout.top_k", "top_p": "rollout.top_p", "min_p": "rollout.min_p",
             "repetition_penalty": "rollout.repetition_penalty"}  # fmt: skip
"""The keys that shape only which token is drawn, each as grpolab's setting (rollout.*)."""

NO_EFFECT = ("use_cache", "cache_implementation", "disable_compile", "pad_token_id", "bos_token_id")
"""Keys that change how fast or with what padding TRL generates, not which tokens are drawn."""

BEAM_SEARCH = ("num_beams", "num_beam_groups", "length_penalty", "early_stopping", "diversity_penalty",
               "constraints", "force_words_ids", "num_return_sequences", "best_of", "use_beam_search")  # fmt: skip
_BEAM_WHY = (
    "beam search: its completions are not draws from the policy, so neither the policy gradient nor the "
    "sampler's log-probs would hold (grpolab samples each token); remove"
)
_SAMPLER_KEYS = "top_k, top_p, min_p, repetition_penalty, do_sample=True, and temperature / max_new_tokens equal to TRL's own"


def generation_kwargs(value: Any, t: Any) -> dict[str, Any]:
    """The rollout.* keys of TRL's ``generation_kwargs``; Refused names every key grpolab cannot take, and why."""
    if value is None:
        return {}
    kwargs = json.loads(value) if isinstance(value, str) else dict(value)  # TRL parses a JSON string the same way
    out: dict[str, Any] = {}
    refused: list[str] = []
    beams = [k for k in kwargs if k in BEAM_SEARCH]
    if beams:
        refused.append(f"{_named(beams)}: {_BEAM_WHY}")
    unknown = [k for k in kwargs if k not in (*DRAW_ONLY, *BEAM_SEARCH, *NO_EFFECT, *_CHECKED)]
    if unknown:
        refused.append(
            f"{_named(unknown)}: not an option of grpolab's sampler (it takes {_SAMPLER_KEYS}), so it would not "
            "draw what TRL draws; remove"
        )
    for key, v in kwargs.items():
        try:
            out |= _one(key, v, t)
        except Refused as err:
            refused.append(str(err))
    if refused:
        raise Refused("; ".join(refused))
    return out


_CHECKED = ("temperature", "max_new_tokens", "max_tokens", "do_sample")


def _named(keys: list[str]) -> str:
    shown = ", ".join(f"generation_kwargs[{k!r}]" for k in keys[:3])
    return shown + (f" (and {len(keys) - 3} more keys)" if len(keys) > 3 else "")


def _one(key: str, v: Any, t: Any) -> dict[str, Any]:
    if key in DRAW_ONLY:
        if not isinstance(v, int | float) or isinstance(v, bool):
            raise Refused(f"generation_kwargs[{key!r}]={v!r}: give a number ({DRAW_ONLY[key]})")
        return {DRAW_ONLY[key]: v}
    if key == "temperature":
        _same(key, v, "temperature", t["temperature"], "take its log-probs at")
    elif key in ("max_new_tokens", "max_tokens"):
        _same(key, v, "max_completion_length", t["max_completion_length"], "budget its tool calls and divide dr_grpo's loss by")
    elif key == "do_sample" and v is not True:
        raise Refused(
            f"generation_kwargs['do_sample']={v!r} decodes greedily: a prompt's completions would all be the same, "
            "and GRPO learns from the differences between samples; remove"
        )
    return {}


def _same(key: str, value: Any, field: str, field_value: Any, what: str) -> None:
    """A key TRL also reads outside the sampler: taken only where it equals TRL's own field."""
    if value != field_value:
        raise Refused(
            f"generation_kwargs[{key!r}]={value!r} differs from {field}={field_value!r}: TRL would sample with "
            f"{value!r} but {what} {field}={field_value!r}; grpolab samples and trains with one value: set "
            f"{field}={value!r} instead"
        )
