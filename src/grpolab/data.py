"""Examples from a source, tokenized once, served in a seeded order that can be saved and resumed."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpolab import jsonio
from grpolab.config import DataConfig
from grpolab.config.templates import apply_template
from grpolab.errors import GrpolabError, one_line
from grpolab.tasks.arithmetic import arithmetic_examples, multiplication_examples
from grpolab.tasks.reasoning_gym import gym_examples
from grpolab.types import Example

Encode = Callable[[Sequence[Example], Any], list[list[int]]]
"""``encode(examples, tokenizer) -> token ids of each prompt``, in place of the template."""


class DataError(GrpolabError, ValueError):
    """A dataset problem; the message names the file, row or field and says how to fix it."""


def load_examples(cfg: DataConfig, *, seed: int) -> list[Example]:
    """All examples of the configured source, with the prompt template applied."""
    if cfg.source == "jsonl" and _builder(cfg.path) in (None, "jsonl"):
        rows = _read_jsonl(Path(cfg.path))
        return _rows_to_examples(rows, cfg, origin=cfg.path)
    if cfg.source == "jsonl":  # a local .json / .parquet / .csv / .arrow file
        return _rows_to_examples(_read_hf(cfg), cfg, origin=cfg.path)
    if cfg.source == "hf":
        return _rows_to_examples(_read_hf(cfg), cfg, origin=cfg.path)
    if cfg.source == "reasoning_gym":

        if not cfg.name:
            raise DataError(
                "data.source=reasoning_gym needs data.name, a reasoning-gym dataset such as 'chain_sum'"
            )
        return _task(gym_examples, cfg, cfg.name, size=cfg.size, seed=seed, params=cfg.params, template=cfg.template)
    if cfg.source == "arithmetic":

        return _task(arithmetic_examples, cfg, size=cfg.size, seed=seed, **dict(cfg.params))
    if cfg.source == "multiplication":

        return _task(multiplication_examples, cfg, size=cfg.size, seed=seed, **dict(cfg.params))
    raise DataError(f"unknown data.source '{cfg.source}'")


def _task(make, cfg: DataConfig, *args: Any, **kwargs: Any) -> list[Example]:
    """A built-in task's examples; a bad data.size / data.params is a DataError naming them."""
    try:
        return make(*args, **kwargs)
    except GrpolabError:
        raise
    except (TypeError, ValueError) as err:
        raise DataError(
            f"data.source={cfg.source} with data.size={cfg.size}, data.params={dict(cfg.params)}: {err}"
        ) from err


def split_eval(examples: Sequence[Example], eval_size: int) -> tuple[list[Example], list[Example]]:
    """(train, eval): the last ``eval_size`` examples are held out and never drawn for training."""
    if eval_size >= len(examples):
        raise DataError(f"data.eval_size={eval_size} leaves no training examples out of {len(examples)}")
    cut = len(examples) - eval_size
    return list(examples[:cut]), list(examples[cut:])


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        raise DataError(f"data.path: {path} does not exist")
    rows = []
    if path.is_dir():
        raise DataError(f"data.path: {path} is a folder; give the JSONL file (or data.source=hf for a dataset folder)")
    with path.open("rb") as fh:
        for lineno, line in enumerate(_utf8_lines(fh, path), 1):
            if not line.strip():
                continue
            try:
                row = jsonio.loads_strict(line, allow_nan=True)  # NaN reaches the field check, which names it
            except jsonio.DuplicateKey as err:
                raise DataError(f"{path}:{lineno}: {err}; keep one of them") from err
            except ValueError as err:
                raise DataError(f"{path}:{lineno} is not valid JSON: {err}") from err
            if not isinstance(row, dict):
                raise DataError(
                    f"{path}:{lineno} must be a JSON object with the prompt field, got {type(row).__name__}"
                )
            rows.append(row)
    if not rows:
        raise DataError(f"{path} holds no rows")
    return rows


def _utf8_lines(fh, path: Path):
    """Lines of a file opened in binary, decoded one at a time so that a bad byte names its line."""
    for lineno, raw in enumerate(fh, 1):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise DataError(
                f"{path}:{lineno} is not UTF-8 text ({err.reason} at column {err.start + 1}); save the file as UTF-8"
            ) from err


def _text_field(row: Mapping[str, Any], key: str, where: str, config_key: str) -> str:
    """The row's ``key`` as text; null, a list, a mapping, a bool or a non-finite number is an error
    (str() would otherwise train on the text "None" or "[...]")."""
    value = row[key]
    if isinstance(value, str):
        return checked_text(value, f"{where}: field '{key}' ({config_key})")
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return str(value)
    raise DataError(
        f"{where}: field '{key}' ({config_key}) is {json.dumps(value) if _jsonable(value) else repr(value)} "
        f"({type(value).__name__}); it must be text (or a finite number). Fix the row or drop it"
    )


def checked_text(text: str, where: str) -> str:
    """``text`` if it is valid Unicode; a lone surrogate (JSON "\\ud800") is a DataError naming its place.

    Python keeps such a string, but no tokenizer and no UTF-8 file can hold it: it would fail later, in
    the tokenizer or while samples.jsonl is written, with a traceback.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise DataError(
            f"{where} holds a lone surrogate ({text[err.start]!r} at character {err.start + 1}), which is not "
            "valid Unicode (a UTF-16 half, e.g. a JSON escape \\ud83d without its pair): fix the row"
        ) from err
    return text


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


BUILDERS: dict[str, str] = {
    ".jsonl": "jsonl",  # grpolab's own reader (errors name the line); data.source=hf reads it with "json"
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".arrow": "arrow",
}
"""Local file suffix -> the ``datasets`` builder that reads it."""


def _builder(path: str) -> str | None:
    return BUILDERS.get(Path(path).suffix.lower())


def _read_hf(cfg: DataConfig) -> list[dict[str, Any]]:
    """A local file (by suffix, through datasets' builders), a save_to_disk folder, or a hub dataset."""
    try:
        import datasets
    except ImportError as err:
        raise DataError(f"data.path {cfg.path} is read with the 'datasets' package: pip install datasets") from err
    local = Path(cfg.path).expanduser()
    builder = _builder(cfg.path)
    if builder is not None and not local.is_dir():
        if not local.is_file():
            raise DataError(f"data.path: {cfg.path} does not exist")
        load = functools.partial(
            datasets.load_dataset, "json" if builder == "jsonl" else builder, data_files=str(local), split="train"
        )
    elif local.is_dir() and any((local / f).exists() for f in ("dataset_dict.json", "state.json")):
        load = functools.partial(_load_from_disk, datasets, local, cfg)  # a folder written by save_to_disk
    else:
        load = functools.partial(datasets.load_dataset, cfg.path, cfg.name, split=cfg.split)
    try:
        ds = load()
    except GrpolabError:
        raise
    except (OSError, ValueError) as err:  # not found, offline, unreadable (pyarrow's errors are ValueErrors)
        what = f"a {builder} file" if builder else "a Hugging Face dataset (hub id or local folder)"
        raise DataError(f"data.path {cfg.path} could not be read as {what}: {one_line(err)}") from err
    return [dict(row) for row in ds]


def _load_from_disk(datasets, local: Path, cfg: DataConfig):
    ds = datasets.load_from_disk(str(local))
    if isinstance(ds, datasets.DatasetDict):
        if cfg.split not in ds:
            raise DataError(f"{cfg.path} has no split '{cfg.split}' (data.split); it has {sorted(ds)}")
        ds = ds[cfg.split]
    return ds


def examples_from_rows(rows: Sequence[Mapping[str, Any]], cfg: DataConfig, *, origin: str) -> list[Example]:
    """Examples from rows already in memory (a datasets.Dataset, a list of dicts), read as a file's rows are."""
    return _rows_to_examples(rows, cfg, origin)


def _rows_to_examples(rows: Sequence[Mapping[str, Any]], cfg: DataConfig, origin: str) -> list[Example]:

    examples = []
    for i, row in enumerate(rows):
        where = f"{origin} row {i + 1}"
        if cfg.prompt_field not in row:
            raise DataError(
                f"{where} has no field '{cfg.prompt_field}' (data.prompt_field); its fields are {sorted(row)}"
            )
        answer = None  # a row without the answer field: only a reward that needs the answer fails (rules.py)
        if cfg.answer_field is not None and row.get(cfg.answer_field) is not None:
            answer = _text_field(row, cfg.answer_field, where, "data.answer_field")
        if isinstance(row[cfg.prompt_field], list):  # TRL's conversational format
            examples.append(_conversational(row, answer, cfg, where))
            continue
        question = _text_field(row, cfg.prompt_field, where, "data.prompt_field")
        prompt = apply_template(cfg.template, question, None if cfg.chat_template else cfg.system_prompt)
        meta = {"row": dict(row), "question": question, "answer_field": cfg.answer_field}
        examples.append(Example(prompt=prompt, answer=answer, meta=meta))
    return examples


def _conversational(row: Mapping[str, Any], answer: str | None, cfg: DataConfig, where: str) -> Example:
    """A row whose prompt is a list of chat messages; data.system_prompt is added when it has no system turn."""
    messages = [_message(msg, f"{where}: '{cfg.prompt_field}'[{j}]") for j, msg in enumerate(row[cfg.prompt_field])]
    if not messages:
        raise DataError(f"{where}: '{cfg.prompt_field}' is an empty list of messages")
    if cfg.template != "none":
        raise DataError(
            f"{where} holds chat messages, which the tokenizer's chat template renders; data.template="
            f"{cfg.template!r} applies to text prompts only: set data.template=none (instructions go in a "
            "system message or data.system_prompt)"
        )
    if cfg.system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": cfg.system_prompt})
    text = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
    question = next((m["content"] for m in reversed(messages) if m["role"] == "user"), text)
    return Example(
        prompt=text,
        answer=answer,
        meta={"row": dict(row), "question": question, "answer_field": cfg.answer_field},
        messages=tuple(messages),
    )


CHAT_ROLES = ("system", "user", "assistant", "tool")
"""The roles a chat template renders (transformers' chat format, TRL's conversational datasets)."""


def _message(msg: Any, where: str) -> dict[str, Any]:
    """One chat message, its content as text: a list of text parts is joined as transformers' templates
    that accept parts render them (in order, nothing between); None, another role or a non-text part is
    an error (str() would train on "None" or on the list's repr)."""
    if not (isinstance(msg, Mapping) and isinstance(msg.get("role"), str) and "content" in msg):
        raise DataError(
            f"{where} is {msg!r}; a conversational prompt is a list of messages like "
            '{"role": "user", "content": "..."}'
        )
    if msg["role"] not in CHAT_ROLES:
        raise DataError(f"{where} has role {msg['role']!r}; a chat message's role is one of {', '.join(CHAT_ROLES)}")
    content = msg["content"]
    if isinstance(content, list):
        bad = [p for p in content if not (isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str))]
        if bad:
            raise DataError(
                f"{where} has a content part {bad[0]!r}; only text parts are supported, like "
                '{"type": "text", "text": "..."} (images and other media are not)'
            )
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise DataError(
            f"{where} has content {json.dumps(content) if _jsonable(content) else repr(content)}; a message's "
            "content is text (or a list of text parts): fix the row or drop the message"
        )
    return {**msg, "content": checked_text(content, where)}


NORMALISATION_FACTOR = 4
"""How many code points a tokenizer's Unicode normaliser may fold into one (NFC / NFKC compose a letter
with up to three marks, e.g. Greek U+1FAF); the character bound below allows for it."""


def prompt_char_limit(tokenizer, max_prompt_length: int) -> int:
    """Characters beyond which a prompt cannot fit in ``max_prompt_length`` tokens, known without tokenising.

    A token stands for at most ``K`` bytes of text, K the UTF-8 length of the longest vocabulary entry
    (its written form: byte-level BPE writes one character per byte and SentencePiece writes U+2581 for
    a space, both at least as long as what they stand for; a byte-fallback token such as <0xE2> stands
    for one byte, less than a character). A character is at least one UTF-8 byte, so n characters need
    at least n / K tokens, n / (4 K) after a normaliser that composes characters. Hence any prompt over
    ``4 K max_prompt_length`` characters is over the limit. This holds for lossless tokenizers (byte-level
    BPE, SentencePiece with byte fallback: every causal LM's in transformers); one that folds a run of
    unknown characters into one <unk> could fit a longer prompt, which is then refused all the same.
    """
    longest = max((len(t.encode("utf-8", "replace")) for t in tokenizer.get_vocab()), default=1)
    return NORMALISATION_FACTOR * max(longest, 1) * max_prompt_length


def check_prompt_chars(examples: Sequence[Example], tokenizer, cfg: DataConfig) -> None:
    """A DataError for the first prompt too long to fit data.max_prompt_length, before any tokenising
    (tokenising a 30 MB line cost 12 GB and minutes); the exact token check follows in tokenize_prompts."""
    limit = prompt_char_limit(tokenizer, cfg.max_prompt_length)
    for i, e in enumerate(examples):
        chars = sum(len(m["content"]) for m in e.messages) if e.messages is not None else len(e.prompt)
        if chars > limit:
            raise DataError(
                f"example {i} has a prompt of {chars} characters: no tokenizer output of it fits "
                f"data.max_prompt_length={cfg.max_prompt_length} tokens (this tokenizer's tokens hold at most "
                f"{limit // (NORMALISATION_FACTOR * cfg.max_prompt_length)} bytes each). Shorten or drop it "
                f"({e.prompt[:60]!r}...)"
            )


def tokenize_prompts(
    examples: Sequence[Example], tokenizer, cfg: DataConfig, encode: Encode | None = None
) -> list[list[int]]:
    """Token ids of every prompt, computed once. A prompt over data.max_prompt_length is an error naming it.
    ``encode(examples, tokenizer)`` replaces the template when the prompt is not the example's text alone
    (with an environment: its first messages with the env's tools declared, rollout.multiturn)."""
    check_prompt_chars(examples, tokenizer, cfg)
    encoded = _encode(examples, tokenizer, cfg) if encode is None else encode(examples, tokenizer)
    for i, ids in enumerate(encoded):
        if len(ids) > cfg.max_prompt_length:
            raise DataError(
                f"example {i} has a prompt of {len(ids)} tokens, over data.max_prompt_length="
                f"{cfg.max_prompt_length}: raise the limit or shorten the prompt ({examples[i].prompt[:60]!r}...)"
            )
        if not ids:
            raise DataError(f"example {i} has an empty prompt")
    return [list(ids) for ids in encoded]


def _encode(examples: Sequence[Example], tokenizer, cfg: DataConfig) -> list[list[int]]:
    """Chat-rendered prompts already hold the template's special tokens; plain text gets the tokenizer's."""
    texts, special = [], []
    for e in examples:
        if e.messages is not None:
            texts.append(_render(list(e.messages), tokenizer, "the dataset's prompts are chat messages", cfg.chat_template_kwargs))
        elif cfg.chat_template:
            texts.append(_chat(e.prompt, tokenizer, cfg))
        else:
            texts.append(e.prompt)
        special.append(e.messages is None and not cfg.chat_template)
    encoded: list[list[int]] = [[] for _ in texts]
    for flag in (True, False):
        idx = [i for i, s in enumerate(special) if s is flag]
        if idx:
            ids = tokenizer([texts[i] for i in idx], add_special_tokens=flag)["input_ids"]
            for i, row in zip(idx, ids, strict=True):
                encoded[i] = row
    return encoded


def _render(messages: list[dict[str, Any]], tokenizer, why: str, template_kwargs: Mapping[str, Any]) -> str:
    if getattr(tokenizer, "chat_template", None) is None:
        raise DataError(
            f"{why}, but the tokenizer has no chat template: use a chat (instruct) model's tokenizer "
            "(model.tokenizer), or give text prompts"
        )
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **template_kwargs)


def _chat(prompt: str, tokenizer, cfg: DataConfig) -> str:
    if getattr(tokenizer, "chat_template", None) is None:
        raise DataError("data.chat_template=true but the tokenizer has no chat template; set it to false")
    messages = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
    messages.append({"role": "user", "content": prompt})
    return _render(messages, tokenizer, "data.chat_template=true", cfg.chat_template_kwargs)


@dataclass
class PromptOrder:
    """Draws prompts without replacement, reshuffling each epoch; its state resumes exactly."""

    size: int
    seed: int
    shuffle: bool = True
    epoch: int = 0
    position: int = 0

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.size))
        # modulo 2**64, the generator's seed width: unchanged for every seed that fitted before
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + self.epoch) % (1 << 64))
        return torch.randperm(self.size, generator=gen).tolist()

    def next(self, count: int) -> list[int]:
        out: list[int] = []
        while len(out) < count:
            order = self._order()
            take = order[self.position : self.position + count - len(out)]
            out.extend(take)
            self.position += len(take)
            if self.position >= self.size:
                self.epoch, self.position = self.epoch + 1, 0
        return out

    @property
    def drawn(self) -> int:
        """Prompts drawn since the start, over every epoch (each ``next`` call's count)."""
        return self.epoch * self.size + self.position

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
