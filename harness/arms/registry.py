"""Which class an arm config means, without ever importing a module because a config file names it.

The known arms' names and dotted paths are the contract's (harness/contract/arm_targets.py: conf/arm/, installed
entry points, the driver's command line); this module imports the classes they name and registers them against it:
- the arms package: conf/arm/NAME.yaml registers NAME, its `_target_` a class in harness/arms/;
- installed packages: an entry point NAME = "module:Class" in the group ENTRY_POINT_GROUP;
- the driver's own command line: an arm kept outside the repo (`--config-dir DIR`, its YAML in DIR/arm/) is admitted
  by the driver that composed it (`admit`), which hands the class to its ranks in the environment (ADMITTED_ENV).
Everything else only looks classes up (`class_of`): a config whose `_target_` names a class none of them has is an
unknown arm, so reading a results folder (bench, the report, analysis) never runs code a file names.
"""
from __future__ import annotations

import logging
import importlib
import os
from functools import lru_cache
from typing import Any, Callable, Mapping

from harness.arms.base import Arm
from harness.contract import arm_targets
from harness.contract.arm_targets import ENTRY_POINT_GROUP, TARGET
from harness.contract.errors import ConfigError
from harness.contract.schema.fields import check_fields, check_value, rules

logger = logging.getLogger(__name__)

ADMITTED_ENV = "HARNESS_ADMITTED_ARM"  # the class the driver admitted, for the ranks it starts

_admitted: dict[str, type[Arm]] = {}  # dotted path -> class, admitted in this process


def dotted_path(arm_class: type) -> str:
    """How `_target_` names a class: 'harness.arms.zero3.Zero3'."""
    return f"{arm_class.__module__}.{arm_class.__qualname__}"


def _import_class(target: str) -> type[Arm]:
    """The Arm subclass a dotted path names, imported: only for a class the user's own configuration names."""
    module_name, _, class_name = target.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as error:
        raise ConfigError(f"arm.{TARGET}", f"cannot import {target!r}: {error}") from error
    return _arm_class(found, target)


def _arm_class(found: Any, target: str) -> type[Arm]:
    if not (isinstance(found, type) and issubclass(found, Arm)):
        raise ConfigError(f"arm.{TARGET}", f"{target!r} is not a subclass of harness.arms.Arm")
    return found


@lru_cache(maxsize=None)
def registered() -> dict[str, type[Arm]]:
    """name -> class of every arm in conf/arm/ (classes of the arms package), then of every installed entry point
    (a name conf/arm/ has keeps its class): the classes the contract's registry names."""
    classes = {name: _import_class(target) for name, target in arm_targets.conf_targets().items()}
    for name, target in arm_targets.entry_targets().items():
        try:
            classes[name] = _import_class(target)
        except Exception as error:  # a broken plug-in costs its arm, never the reader
            logger.warning(f"warning: entry point {name} = {target} ({ENTRY_POINT_GROUP}): {error}")
    return classes


def admit(arm_cfg: Mapping[str, Any]) -> None:
    """The driver's own arm: import the class its composed config names (the user's command line and config dirs
    chose it), so that class_of knows it. Only the driver calls this, on the config it composed itself."""
    target = arm_cfg.get(TARGET) if isinstance(arm_cfg, Mapping) else None
    if isinstance(target, str) and target and _known(target) is None:
        _admitted[target] = _import_class(target)
        arm_targets.admit(target)


def admit_handed(arm_cfg: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> None:
    """A rank's arm: import the class its driver admitted and handed it (ADMITTED_ENV), where its config names that
    class; nothing else. Only the rank calls this, so every other lookup stays a lookup."""
    target = arm_cfg.get(TARGET) if isinstance(arm_cfg, Mapping) else None
    if isinstance(target, str) and target and target == environ.get(ADMITTED_ENV) and _known(target) is None:
        _admitted[target] = _import_class(target)


def handed_to_ranks(arm_cfg: Mapping[str, Any]) -> str | None:
    """The class the driver admitted for this config, which its ranks must admit too (None for a known arm)."""
    target = arm_cfg.get(TARGET)
    return target if isinstance(target, str) and target in _admitted else None


def _known(target: str) -> type[Arm] | None:
    """The known class a dotted path names, without importing anything it names (a rank imports the one class its
    driver handed it, admit_handed)."""
    for arm_class in registered().values():
        if dotted_path(arm_class) == target:
            return arm_class
    return _admitted.get(target)


def class_of(arm_cfg: Mapping[str, Any]) -> type[Arm]:
    """The class an arm config means: by `_target_` among the known classes, by `arm.name` for run dirs written
    before `_target_`; ConfigError for an unknown arm. Never imports a module the config names."""
    target = arm_cfg.get(TARGET)
    if target:
        found = _known(str(target))
        if found is None:
            raise arm_targets.unknown_target(str(target))
        return found
    name = arm_cfg.get("name")
    if not isinstance(name, str) or name not in registered():
        raise ConfigError("arm.name", f"unknown arm {name!r}; expected one of {sorted(registered())}")
    return registered()[name]


def known_class(config: Mapping[str, Any]) -> type[Arm] | None:
    """The known class of a point's arm (a run dir's config), or None for an unknown arm (never imported)."""
    arm = config.get("arm")
    try:
        return class_of(arm) if isinstance(arm, Mapping) else None
    except ConfigError:
        return None


def check_knobs(arm_cfg: Mapping[str, Any]) -> None:
    """The arm group's values by its class (the schema hands the arm group here, harness/contract/schema/); a knob
    of another arm that a campaign sets for every arm (arm.schedule under arm=zero3) is checked as that arm checks
    it."""
    own = class_of(arm_cfg)
    other_knobs = [name for other in registered().values() for name in rules(other)]
    check_fields("arm", own, arm_cfg, also_known=[TARGET, *other_knobs])
    for other in registered().values():
        for name, rule in rules(other).items():
            if name in arm_cfg and name not in rules(own) and rule.check is not None:
                check_value(f"arm.{name}", rule, arm_cfg[name])


def from_config(arm_cfg: Mapping[str, Any]) -> Arm:
    """The arm object of a config's arm group."""
    return class_of(arm_cfg).from_config(arm_cfg)


def arm_names(where: Callable[[type[Arm]], bool] = lambda arm: True,
              order: Callable[[type[Arm]], int] = lambda arm: arm.display.table_order) -> tuple[str, ...]:
    """Names of the registered arms whose class satisfies `where`, in `order` (then by name)."""
    chosen = [(order(arm), name) for name, arm in registered().items() if where(arm)]
    return tuple(name for _, name in sorted(chosen))
