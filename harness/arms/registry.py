"""Which class an arm config means: `_target_` (Hydra's key naming a class) where the config has it, else the
class conf/arm/ registers under `arm.name` (run dirs written before `_target_`; analysis looks arms up by name)."""
from __future__ import annotations

import importlib
from functools import lru_cache
from typing import Any, Callable, Mapping

import yaml

from harness.arms.base import Arm
from harness.envinfo import REPO_ROOT
from harness.errors import ConfigError

TARGET = "_target_"
ARM_CONF_DIR = REPO_ROOT / "conf" / "arm"


def import_class(target: str) -> type[Arm]:
    """The Arm subclass a dotted path names ('harness.arms.zero3.Zero3')."""
    module_name, _, class_name = str(target).rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as error:
        raise ConfigError(f"arm.{TARGET}", f"cannot import {target!r}: {error}") from error
    if not (isinstance(found, type) and issubclass(found, Arm)):
        raise ConfigError(f"arm.{TARGET}", f"{target!r} is not a subclass of harness.arms.Arm")
    return found


@lru_cache(maxsize=None)
def registered() -> dict[str, type[Arm]]:
    """name -> class of every arm in conf/arm/."""
    classes = {}
    for path in sorted(ARM_CONF_DIR.glob("*.yaml")):
        arm_cfg = yaml.safe_load(path.read_text())
        classes[arm_cfg["name"]] = import_class(arm_cfg[TARGET])
    return classes


def class_of(arm_cfg: Mapping[str, Any]) -> type[Arm]:
    """The class an arm config means; ConfigError for one this checkout does not have."""
    if arm_cfg.get(TARGET):
        return import_class(arm_cfg[TARGET])
    name = arm_cfg.get("name")
    if name not in registered():
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
