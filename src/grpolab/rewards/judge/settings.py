"""A judge's settings: the kwargs of ``reward.functions[i]`` for ``judge`` and ``group_judge``, typed and checked.

Every check raises a ValueError whose message names the key; the registry (rewards/__init__.py) prefixes it with
``reward.functions[i]``, so a bad key is one line before anything is started or asked.
"""

from __future__ import annotations

import difflib
import math
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args

ScoreKind = Literal["number", "verdict", "yes_probability"]

FIXED_PLACEHOLDERS = frozenset({"question", "prompt", "completion", "answer", "completions", "group_size"})
"""What every template may name; any other ``{name}`` is a dataset column, looked up per example."""


@dataclass(frozen=True)
class ServeSettings:
    """A vLLM server grpolab starts on loopback for the judge, and stops at the end of the run."""

    model: str = ""
    """The judge's model: a folder, a hub id, a .gguf file or ``package:<module>/<file>`` (as model.name_or_path).
    Its own weights, in its own process: a judge never shares weights with the policy."""
    max_model_len: int = 2048
    """Tokens of prompt + answer the server accepts (the template, the question, the completion(s), the reply)."""
    dtype: str = "auto"
    """vLLM's --dtype (auto: the model's; on a CPU bfloat16 or float32)."""
    kv_cache_gib: int = 1
    """GiB of KV cache (on a CPU: VLLM_CPU_KVCACHE_SPACE)."""
    start_timeout_s: float = 600.0
    """Seconds the server may take to answer /health."""
    chat_template: str | None = None
    """A Jinja chat template (text or file) for a model that has none; null = the model's own."""
    max_num_seqs: int | None = None
    """vLLM's --max-num-seqs (requests batched together); null = vLLM's default."""


@dataclass(frozen=True)
class JudgeSettings:
    """How a judge is asked and how its answer becomes a score (docs/rewards.md, "Judges")."""

    template: str
    """The user message sent to the judge, with ``{question}``, ``{prompt}``, ``{completion}``, ``{answer}``
    (the reference answer), any dataset column ``{column}``; group_judge: ``{completions}`` (numbered) and
    ``{group_size}``. A literal brace is doubled: ``{{``."""
    base_url: str | None = None
    """An OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 (one of base_url and serve)."""
    serve: ServeSettings | None = None
    """A vLLM server grpolab starts for the judge (one of base_url and serve)."""
    model: str | None = None
    """The model name sent in each request; null = "judge" (the name grpolab serves it under) with serve."""
    api_key_env: str | None = None
    """The environment variable holding the endpoint's API key (sent as a Bearer token); null = none."""
    system: str | None = None
    """A system message sent before the template; null = none."""
    score: ScoreKind = "number"
    """How the reply becomes a score: number (in score_range), verdict (a word of verdicts), yes_probability
    (P(yes) / (P(yes) + P(no)) of the first token, from the returned log-probs). group_judge: number only."""
    score_range: tuple[float, float] = (0.0, 10.0)
    """number: the scale the template asks for; a number outside it is an unparseable answer."""
    score_regex: str | None = None
    """number: a regex whose first group is the score (the last match counts); null = the built-in patterns."""
    verdicts: Mapping[str, float] = field(default_factory=lambda: {"yes": 1.0, "no": 0.0})
    """verdict: word -> score (in output_range's units: 1 = its top); the last verdict word in the reply counts."""
    yes_tokens: tuple[str, ...] = ("yes",)
    """yes_probability: the first token's texts that mean yes (compared stripped and lowercased)."""
    no_tokens: tuple[str, ...] = ("no",)
    """yes_probability: the texts that mean no."""
    top_logprobs: int = 20
    """yes_probability: log-probs asked for the first token (vLLM's default limit is 20)."""
    output_range: tuple[float, float] = (0.0, 1.0)
    """The reward's range: the parsed score, normalised to [0, 1], is mapped onto it."""
    max_tokens: int = 256
    """Tokens the judge may write (yes_probability: 1 is enough)."""
    temperature: float = 0.0
    """The judge's sampling temperature (0: the same answer for the same question, so a cached score is exact)."""
    concurrency: int = 8
    """Requests in flight at once."""
    timeout_s: float = 60.0
    """Seconds one request may take as a whole (connect, wait, every byte of the answer)."""
    max_retries: int = 2
    """Times a request that timed out, could not connect or got a server error (5xx, 429) is sent again."""
    cache_size: int = 65536
    """Scores kept by (request, reply settings); cleared at each training step."""
    name: str = "judge"
    """The name logged as rewards/<name>/..."""

    def __post_init__(self) -> None:
        _check_types(self)
        _check_where(self)
        _check_numbers(self)
        if self.score == "number" and self.score_regex is not None:
            try:
                compiled = re.compile(self.score_regex)
            except re.error as err:
                raise ValueError(f"score_regex {self.score_regex!r} is not a regex ({err})") from None
            if compiled.groups < 1:
                raise ValueError(f"score_regex {self.score_regex!r} needs a group around the number, e.g. 'Score: (\\d+)'")
        if self.score == "verdict" and not self.verdicts:
            raise ValueError("verdicts is empty: map each verdict word to its score, e.g. {correct: 1, incorrect: 0}")
        if self.score == "yes_probability" and not (self.yes_tokens and self.no_tokens):
            raise ValueError("yes_tokens and no_tokens must each name at least one token text, e.g. [yes] and [no]")

    @property
    def model_name(self) -> str:
        return self.model or "judge"


_TEXT = (str,)
_NUMBER = (int, float)
TYPES: dict[str, tuple[type, ...]] = {
    "template": _TEXT, "base_url": (*_TEXT, type(None)), "model": (*_TEXT, type(None)),
    "api_key_env": (*_TEXT, type(None)), "system": (*_TEXT, type(None)), "score": _TEXT,
    "score_regex": (*_TEXT, type(None)), "verdicts": (Mapping,), "yes_tokens": (tuple,), "no_tokens": (tuple,),
    "top_logprobs": (int,), "max_tokens": (int,), "temperature": _NUMBER, "concurrency": (int,),
    "timeout_s": _NUMBER, "max_retries": (int,), "cache_size": (int,), "name": _TEXT,
    "score_range": (tuple,), "output_range": (tuple,),
}  # fmt: skip
"""Each key's accepted types (a bool is no number here)."""


def _check_types(s: JudgeSettings) -> None:
    for key, kinds in TYPES.items():
        value = getattr(s, key)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise ValueError(f"{key} = {value!r} is a {type(value).__name__}; give a {' or '.join(k.__name__ for k in kinds)}")
    if s.score not in get_args(ScoreKind):
        raise ValueError(f"score {s.score!r} is not one of {', '.join(get_args(ScoreKind))}")
    for key in ("score_range", "output_range"):
        pair = getattr(s, key)
        if len(pair) != 2 or not all(isinstance(v, _NUMBER) and not isinstance(v, bool) for v in pair):
            raise ValueError(f"{key} must be two numbers [low, high], got {list(pair)}")
    if any(isinstance(w, bool) for w in (*s.verdicts, *s.yes_tokens, *s.no_tokens)):
        raise ValueError("a verdict or token reads as a boolean: YAML reads yes, no, on, off unquoted as true / false; "
                         "quote them, e.g. yes_tokens: ['yes']")  # fmt: skip
    for word, value in s.verdicts.items():
        if not isinstance(word, str) or not word.strip() or not isinstance(value, _NUMBER) or isinstance(value, bool):
            raise ValueError(f"verdicts must map words to numbers, e.g. {{correct: 1, incorrect: 0}}; got {word!r}: {value!r}")
    if not all(isinstance(t, str) for t in (*s.yes_tokens, *s.no_tokens)):
        raise ValueError("yes_tokens and no_tokens must be lists of token texts")


def _check_where(s: JudgeSettings) -> None:
    if (s.base_url is None) == (s.serve is None):
        raise ValueError(
            "give the judge one of base_url (an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1) "
            "and serve: {model: <path>} (a vLLM server grpolab starts)"
        )
    if s.base_url is not None and not re.match(r"^https?://[^/\s]+", s.base_url):
        raise ValueError(f"base_url {s.base_url!r} is not an http(s) URL, e.g. http://127.0.0.1:8000/v1")
    if s.base_url is not None and s.model is None:
        raise ValueError("model is missing: name the model the endpoint serves (sent in each request)")
    if s.serve is not None and not s.serve.model:
        raise ValueError("serve.model is missing: give the judge's model (a folder, hub id, .gguf or package: path)")
    if s.api_key_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", s.api_key_env):
        raise ValueError(f"api_key_env {s.api_key_env!r} is not an environment variable's name")


def _check_numbers(s: JudgeSettings) -> None:
    for key in ("score_range", "output_range"):
        low, high = getattr(s, key)
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(f"{key} must be [low, high] with finite low < high, got {[low, high]}")
    positive = {"max_tokens": s.max_tokens, "concurrency": s.concurrency, "top_logprobs": s.top_logprobs,
                "cache_size": s.cache_size}  # fmt: skip
    for key, value in positive.items():
        if value < 1:
            raise ValueError(f"{key} must be >= 1, got {value}")
    if not (s.timeout_s > 0 and math.isfinite(s.timeout_s)):
        raise ValueError(f"timeout_s must be a positive number of seconds, got {s.timeout_s}")
    if s.max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {s.max_retries}")
    if not (0 <= s.temperature <= 2):
        raise ValueError(f"temperature must be in [0, 2], got {s.temperature}")
    if s.serve is not None and (s.serve.max_model_len < 16 or s.serve.kv_cache_gib < 1 or s.serve.start_timeout_s <= 0):
        raise ValueError("serve: max_model_len must be >= 16, kv_cache_gib >= 1 and start_timeout_s > 0")


def placeholders(template: str) -> set[str]:
    """The ``{names}`` a template uses; a ValueError for a template str.format cannot read."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise ValueError(f"template cannot be read ({err}); write a literal brace as {{{{ or }}}}") from None
    names = set()
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise ValueError(f"template placeholder {{{name}}} must be a plain name such as {{completion}}")
        names.add(name)
    return names


def _typed(cls: type, raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``raw`` with unknown keys refused (close names suggested) and tuples made of lists."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=2)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown judge key {where}{unknown[0]!r}{hint} (known: {', '.join(sorted(known))})")
    out = dict(raw)
    for key in ("score_range", "output_range", "yes_tokens", "no_tokens"):
        if key in out and isinstance(out[key], list):
            out[key] = tuple(out[key])
    return out


def settings_from(kwargs: Mapping[str, Any], *, group: bool) -> JudgeSettings:
    """The settings of ``judge`` (``group=False``) or ``group_judge`` kwargs; a ValueError names the bad key."""
    raw = _typed(JudgeSettings, kwargs, "")
    serve = raw.get("serve")
    if serve is not None:
        if not isinstance(serve, Mapping):
            raise ValueError(f"serve must be a mapping such as {{model: <path>}}, got {serve!r}")
        raw["serve"] = ServeSettings(**_typed(ServeSettings, serve, "serve."))
    if "template" not in raw:
        raise ValueError("template is missing: write the message the judge gets, e.g. 'Grade this answer: {completion}'")
    try:
        settings = JudgeSettings(**raw)
    except TypeError as err:
        raise ValueError(str(err)) from None
    names = placeholders(settings.template)
    if group:
        if settings.score != "number":
            raise ValueError(f"group_judge scores with numbers only (one per completion); got score={settings.score!r}")
        if "completions" not in names:
            raise ValueError("a group_judge template must show the group: put {completions} in it")
        if "completion" in names:
            raise ValueError("a group_judge template shows all completions as {completions}; {completion} is judge's")
    elif "completions" in names:
        raise ValueError("{completions} is group_judge's; a judge sees one {completion}")
    elif "completion" not in names:
        raise ValueError("a judge template must show the answer to grade: put {completion} in it")
    return settings
