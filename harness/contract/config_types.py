"""The types of a recorded config.yaml, as a reader needs them: a value of the wrong type for its key (a string
where a number belongs, a list or a section where a name belongs, an integer too large to compute with) would
fail the tables that group or compute by it. Only the type is checked, from the schema's rule for the key: values
recorded by an older harness may lie outside today's ranges or choices and are still read; a key the config
lacks, or one the schema does not know, is no concern of this check.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from harness.contract.checks import Choice, Number, PlainName, Text, is_usable_number, shown

SCALARS = (str, int, float, bool, type(None))


ArmClassOf = Callable[[Mapping[str, Any]], "type | None"]  # a run's config -> its arm's known class, or None


def wrong_types(config: Mapping[str, Any], arm_class_of: ArmClassOf | None = None) -> list[str]:
    """'key: must be ..., got ...' for each value of the wrong type, in the schema's order (none: the config's
    types can be read). The arm's own knobs are checked by the class `arm_class_of` finds (harness.arms.known_class,
    handed in by a caller above the contract); without it, or for an unknown arm, they stay labels."""
    from harness.contract import schema
    from harness.contract.schema.fields import rules

    found = []
    for name, group in schema.GROUPS.items():
        found += _section_problems(name, rules(group), config.get(name))
    arm_class = arm_class_of(config) if arm_class_of is not None else None
    if arm_class is not None:
        found += _section_problems("arm", rules(arm_class), config.get("arm"))
    return found


def _section_problems(prefix: str, section_rules: Mapping[str, Any], section: Any) -> list[str]:
    from harness.contract.schema.fields import rules

    if section is None:
        return []
    if not isinstance(section, Mapping):
        return [f"{prefix}: must be a section of keys, got {shown(section)}"]
    found = []
    for name, rule in section_rules.items():
        if name not in section:
            continue
        key, value = f"{prefix}.{name}", section[name]
        if isinstance(rule.check, type):  # a nested schema (model.config)
            found += _section_problems(key, rules(rule.check), value)
        else:
            kind = _wrong_kind(rule.check, value)
            if kind is not None:
                found.append(f"{key}: must be {kind}, got {shown(value)}")
    return found


def _wrong_kind(check: Any, value: Any) -> str | None:
    """What the value should have been, where its type is wrong for the check; None where it is right. A number
    key takes null (an older harness's "unset") or a number; a key of names or text takes any single value (older
    runs wrote some choices as numbers: a label either way)."""
    if isinstance(check, Number):
        if value is None:
            return None
        integer = check.integer and not isinstance(value, int)
        return "a number one can compute with" if integer or not is_usable_number(value) else None
    if isinstance(check, (Choice, Text, PlainName)):
        return None if isinstance(value, SCALARS) else "a single value"
    return None  # a type the schema does not check (a list of steps, say)
