"""Checks of one config value by kind (a number in a range, a choice, text, a plain name), each refusing with one
ConfigError that names the key. The config schema (harness/contract/schema/) gives each key its check."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from harness.contract.errors import ConfigError

MISSING = object()  # a key the config does not have, as opposed to one set to null


# No count, size in GB or time in seconds the harness takes comes near this; past it a GB amount turned into
# bytes, or seconds into a timer, overflows (1e300 GB is inf bytes), so every number key refuses it.
LARGEST_MAGNITUDE = 1e12


def is_finite_number(value) -> bool:
    """An int or float that is not a bool, NaN or infinite (a GB amount from a YAML file or a command line); an
    int too large for a float is not one (math.isfinite raises OverflowError on it)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def is_usable_number(value) -> bool:
    """A finite number no larger than LARGEST_MAGNITUDE: one the harness can compute with."""
    return is_finite_number(value) and abs(value) <= LARGEST_MAGNITUDE


SHOWN_CHARS = 60  # an error names a value by at most this much of it: one line, whatever the value


def shown(value: Any) -> str:
    """A value as an error line quotes it: its repr cut to SHOWN_CHARS, an integer of many digits by its size."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of {int(value.bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


def _yaml(value: Any) -> str:
    """A value as the command line spells it (null, true)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


@dataclass(frozen=True)
class Number:
    """A finite int or float (never a bool, NaN or inf) within [low, high], an end left out where `*_open`.
    `integer`: an int; `whole`: an int or a float without fraction (element counts such as 5e7);
    `nullable`: null is allowed (and means a default)."""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    whole: bool = False
    nullable: bool = False

    def check(self, key: str, value: Any) -> None:
        if value is None and self.nullable:
            return
        if not self.accepts(value):
            raise ConfigError(key, f"must be {self.describe()}, got {shown(value)}")
        if not is_usable_number(value):
            raise ConfigError(key, f"must be {self.describe()} and at most {LARGEST_MAGNITUDE:g} in size, "
                              f"got {shown(value)}")

    def accepts(self, value: Any) -> bool:
        """Whether the value is of the kind and in the range (its size is checked apart, for its own message)."""
        if not is_finite_number(value) or (self.integer and not isinstance(value, int)):
            return False
        if self.whole and not float(value).is_integer():
            return False
        above_low = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below_high = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above_low and below_high

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a whole number" if self.whole else "a finite number"
        if self.low is not None and self.high is not None:
            opening, closing = "(" if self.low_open else "[", ")" if self.high_open else "]"
            kind += f" in {opening}{_yaml(self.low)}, {_yaml(self.high)}{closing}"
        elif self.low is not None:
            kind += f" {'>' if self.low_open else '>='} {_yaml(self.low)}"
        elif self.high is not None:
            kind += f" {'<' if self.high_open else '<='} {_yaml(self.high)}"
        return f"null or {kind}" if self.nullable else kind


@dataclass(frozen=True)
class Choice:
    """One of a few values, compared with their type (so 1 is not true and '1' is not 1)."""
    options: tuple

    def check(self, key: str, value: Any) -> None:
        if not any(type(value) is type(option) and value == option for option in self.options):
            raise ConfigError(key, f"must be one of {', '.join(map(_yaml, self.options))}, got {shown(value)}")


# Control characters (NUL above all) cannot go into an environment variable, a W&B name or a folder name.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Text:
    """A string without control characters; `nullable`: null is allowed too."""
    nullable: bool = False

    def check(self, key: str, value: Any) -> None:
        if value is None and self.nullable:
            return
        if not isinstance(value, str) or _CONTROL.search(value):
            kind = "a string without control characters"
            raise ConfigError(key, f"must be {'null or ' if self.nullable else ''}{kind}, got {shown(value)}")


_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,99}")


@dataclass(frozen=True)
class PlainName:
    """A name that is one folder: letters, digits and `_ . + -`, not starting with a dot, at most 100 characters
    (never a path: no separator, no `..`)."""

    def check(self, key: str, value: Any) -> None:
        if not (isinstance(value, str) and _PLAIN_NAME.fullmatch(value)):
            raise ConfigError(key, "must be a plain name (letters, digits, _ . + -; not starting with a dot; "
                              f"at most 100 characters), got {shown(value)}")


POSITIVE_INT = Number(low=1, integer=True)
POSITIVE = Number(low=0, low_open=True)
BOOL = Choice((True, False))


def lookup(cfg: Mapping[str, Any], dotted: str, default: Any = MISSING) -> Any:
    """cfg['a']['b'] for 'a.b'; `default` where a section or the key is absent."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node
