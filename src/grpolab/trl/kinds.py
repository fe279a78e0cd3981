"""The three kinds of TRL GRPOConfig field (grpolab.trl.fields gives each field one) and the table's helpers.

* mapped: ``convert(value, trl)`` returns the grpolab dotted keys that reproduce TRL's behaviour, or
  raises ``Refused`` for a value grpolab cannot reproduce. ``named(convert)`` is a mapped field of the one
  TRL name table (grpolab.config.trl_names.TRL_NAMES, which the config loader's unknown-key hint reads too):
  its words are that table's, filled in by ``worded``; ``mapped(why, convert)`` is one convert-trl alone
  describes. Fields read by another field's converter (``gradient_accumulation_steps`` by
  ``per_device_train_batch_size``) are ``read_by`` it and return {};
* refused: grpolab lacks the feature; any value but TRL's default is refused, with ``why``;
* not_applicable: infrastructure (DeepSpeed, the Hub, dataloader workers, vLLM server ports) that does
  not change what is trained; a non-default value is listed in the output, never converted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from grpolab.config.trl_names import TRL_NAMES

if TYPE_CHECKING:
    from grpolab.trl.convert import TrlView


class Refused(ValueError):
    """A TRL value grpolab cannot reproduce; the message says why and what to set instead."""


Convert = Callable[[Any, "TrlView"], dict[str, Any]]


@dataclass(frozen=True)
class TrlField:
    status: Literal["mapped", "refused", "not_applicable"]
    why: str
    """mapped: the grpolab keys and how; refused / not_applicable: the reason."""
    convert: Convert | None = None
    read_with: str = ""
    """read_by's field: the one whose converter reads this one."""


def mapped(why: str, convert: Convert) -> TrlField:
    """A mapped field convert-trl alone describes: its name is not in TRL_NAMES."""
    return TrlField("mapped", why, convert)


def named(convert: Convert) -> TrlField:
    """A mapped field of TRL_NAMES (grpolab.config.trl_names): ``worded`` gives it the table's words."""
    return TrlField("mapped", "", convert)


def read_by(other: str) -> TrlField:
    return TrlField("mapped", f"read with {other}", lambda v, t: {}, read_with=other)


def worded(rules: Mapping[str, TrlField]) -> dict[str, TrlField]:
    """``rules`` with each ``named`` field's words taken from TRL_NAMES, the one place they are written. A
    field of TRL_NAMES that writes words of its own, or a ``named`` field TRL_NAMES lacks, is an error."""
    out = {}
    for name, rule in rules.items():
        words = TRL_NAMES.get(name)
        if rule.why and (words is None or rule.read_with):
            out[name] = rule
        elif words is None:
            raise ValueError(f"convert-trl: {name} is named() but has no words in grpolab.config.trl_names")
        elif rule.why:
            raise ValueError(
                f"convert-trl: {name}'s words are grpolab.config.trl_names' (the config loader's hint reads them "
                "too): make its rule named(convert) instead of writing them again"
            )
        else:
            out[name] = dataclasses.replace(rule, why=words)
    return out


def refused(why: str) -> TrlField:
    return TrlField("refused", why)


def not_applicable(why: str) -> TrlField:
    return TrlField("not_applicable", why)


def to_key(key: str) -> Convert:
    return lambda v, t: {key: v}
