"""Which class an arm config means, without ever importing a module because a config file names it.

Known classes come from three places, none of them a run dir:
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
import importlib.metadata
import os
from functools import lru_cache
from typing import Any, Callable, Mapping

import yaml

from harness.arms.base import Arm
from harness.contract.envinfo import REPO_ROOT
from harness.contract.errors import ConfigError

logger = logging.getLogger(__name__)

TARGET = "_target_"
ARM_CONF_DIR = REPO_ROOT / "conf" / "arm"
ARMS_PACKAGE = "harness.arms"
ENTRY_POINT_GROUP = "offload_harness.arms"
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
    (a name conf/arm/ has keeps its class)."""
    classes = {}
    for path in sorted(ARM_CONF_DIR.glob("*.yaml")):
        arm_cfg = yaml.safe_load(path.read_text())
        target = str(arm_cfg[TARGET])
        if not target.startswith(f"{ARMS_PACKAGE}."):
            raise ConfigError(f"arm.{TARGET}", f"conf/arm/{path.name} names {target!r}, not a class of {ARMS_PACKAGE}")
        classes[arm_cfg["name"]] = _import_class(target)
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name not in classes:
            try:
                classes[entry.name] = _arm_class(entry.load(), entry.value)
            except Exception as error:  # a broken plug-in costs its arm, never the reader
                logger.warning(f"warning: entry point {entry.name} = {entry.value} ({ENTRY_POINT_GROUP}): {error}")
    return classes


def admit(arm_cfg: Mapping[str, Any]) -> None:
    """The driver's own arm: import the class its composed config names (the user's command line and config dirs
    chose it), so that class_of knows it. Only the driver calls this, on the config it composed itself."""
    target = arm_cfg.get(TARGET) if isinstance(arm_cfg, Mapping) else None
    if isinstance(target, str) and target and _known(target) is None:
        _admitted[target] = _import_class(target)


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
            raise ConfigError(f"arm.{TARGET}", f"unknown arm class {target!r}: not an arm of {ARMS_PACKAGE}, of an "
                              f"entry point ({ENTRY_POINT_GROUP}) or of the driver's command line")
        return found
    name = arm_cfg.get("name")
    if not isinstance(name, str) or name not in registered():
        raise ConfigError("arm.name", f"unknown arm {name!r}; expected one of {sorted(registered())}")
    return registered()[name]


def from_config(arm_cfg: Mapping[str, Any]) -> Arm:
    """The arm object of a config's arm group."""
    return class_of(arm_cfg).from_config(arm_cfg)


def arm_names(where: Callable[[type[Arm]], bool] = lambda arm: True,
              order: Callable[[type[Arm]], int] = lambda arm: arm.display.table_order) -> tuple[str, ...]:
    """Names of the registered arms whose class satisfies `where`, in `order` (then by name)."""
    chosen = [(order(arm), name) for name, arm in registered().items() if where(arm)]
    return tuple(name for _, name in sorted(chosen))
