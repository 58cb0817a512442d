"""How a schema dataclass says what a config key may hold, and the checker that reads it.

A field's type names its allowed values: `Literal[...]` lists the choices, `Optional[...]` also allows null, `bool`
means true or false, `str` text without control characters. What a type cannot say rides in `Annotated[...]`: a
`Number` range (nullable when the type is Optional) or another object with `.check(key, value)`, and SOMETIMES for a
key that only some options of its group have (checked when present). A field typed with another dataclass is a
nested section (model.config). A key that no field names is refused: a typo never runs with the default.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from functools import lru_cache
from typing import Annotated, Any, Collection, Literal, Mapping, Union

from harness.contract.checks import BOOL, MISSING, Choice, Number, Text
from harness.contract.errors import ConfigError

SOMETIMES = "sometimes"  # in Annotated[...]: only some options of the group have this key


@dataclasses.dataclass(frozen=True)
class Column:
    """In Annotated[...]: the key is a column of the analysis's point rows, named `name` (default: the key's name)."""
    name: str | None = None


COLUMN = Column()


@dataclasses.dataclass(frozen=True)
class Rule:
    """What one field allows: `check` is a Number, a Choice, another check, a nested schema class, or None."""
    check: Any
    sometimes: bool


def _without_null(hint: Any) -> tuple[bool, Any]:
    """(whether the type allows null, the type without None)."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = typing.get_args(hint)
        rest = tuple(arg for arg in args if arg is not type(None))
        if len(rest) < len(args):
            return True, rest[0] if len(rest) == 1 else Union[rest]
    return False, hint


def _rule(hint: Any) -> Rule:
    extras: tuple = ()
    if typing.get_origin(hint) is Annotated:
        hint, *extras = typing.get_args(hint)
    nullable, inner = _without_null(hint)
    given = [extra for extra in extras if hasattr(extra, "check")]
    if given:
        check = dataclasses.replace(given[0], nullable=True) if nullable and isinstance(given[0], Number) else given[0]
    elif typing.get_origin(inner) is Literal:
        check = Choice(((None,) if nullable else ()) + typing.get_args(inner))
    elif inner is bool:
        check = Choice((None, True, False)) if nullable else BOOL
    elif inner is str:
        check = Text(nullable)
    elif dataclasses.is_dataclass(inner):
        check = inner
    else:
        check = None
    return Rule(check, SOMETIMES in extras)


@lru_cache(maxsize=None)
def rules(schema: type) -> dict[str, Rule]:
    """Field name -> its Rule, in field order."""
    hints = typing.get_type_hints(schema, include_extras=True)
    return {field.name: _rule(hints[field.name]) for field in dataclasses.fields(schema)}


@lru_cache(maxsize=None)
def columns(schema: type) -> dict[str, str]:
    """Field name -> its analysis column, for the fields marked with a Column, in field order."""
    hints = typing.get_type_hints(schema, include_extras=True)
    marked = {field.name: _column(hints[field.name]) for field in dataclasses.fields(schema)}
    return {name: column.name or name for name, column in marked.items() if column is not None}


def _column(hint: Any) -> Column | None:
    extras = typing.get_args(hint)[1:] if typing.get_origin(hint) is Annotated else ()
    return next((extra for extra in extras if isinstance(extra, Column)), None)


def check_fields(prefix: str, schema: type, values: Any, also_known: Collection[str] = ()) -> None:
    """Check each field of `schema` in `values` (one group's keys); a ConfigError names `prefix.field`. A key that is
    neither a field nor in `also_known` is refused."""
    if not isinstance(values, Mapping):
        raise ConfigError(prefix, f"must be a section of keys, got {values!r}")
    refuse_unknown_keys(prefix, values, [*rules(schema), *also_known])
    for name, rule in rules(schema).items():
        if rule.check is not None and (name in values or not rule.sometimes):
            check_value(f"{prefix}.{name}", rule, values.get(name, MISSING))


def refuse_unknown_keys(prefix: str, values: Mapping[str, Any], known: Collection[str]) -> None:
    """The first key of `values` that is not `known`, refused naming it (a typo, or a key this harness lacks)."""
    unknown = [name for name in values if name not in known]
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else str(unknown[0])
        raise ConfigError(key, f"unknown key; {prefix or 'the config'} has {', '.join(map(str, known))}")


def check_value(key: str, rule: Rule, value: Any) -> None:
    if value is MISSING:
        raise ConfigError(key, "missing")
    if isinstance(rule.check, type):  # a nested schema
        check_fields(key, rule.check, value)
    else:
        rule.check.check(key, value)


def choices(schema: type, name: str) -> tuple:
    """The allowed values of a choice field, as its type lists them (None first where null is allowed)."""
    check = rules(schema)[name].check
    if not isinstance(check, Choice):
        raise TypeError(f"{schema.__name__}.{name} is not a choice")
    return check.options
