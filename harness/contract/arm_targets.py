"""Which arm classes are known, by name and dotted path, read without importing any of them.

A run's `arm._target_` names its arm's class; this registry says whether that class is a known one. Known paths come
from three places, none of them a run dir:
- conf/arm/NAME.yaml registers NAME, its `_target_` a class of the arms package (harness/arms/);
- installed packages: an entry point NAME = "module:Class" in the group ENTRY_POINT_GROUP;
- the driver's own command line: an arm kept outside the repo, admitted by the driver that composed it (`admit`).
The arms package imports the classes these paths name (harness/arms/registry.py); the contract only reads the
names, so the schema, the reader and the analysis know a run's arm without running code a file names.
"""
from __future__ import annotations

import importlib.metadata
from functools import lru_cache

import yaml

from harness.contract.envinfo import REPO_ROOT
from harness.contract.errors import ConfigError

TARGET = "_target_"
ARM_CONF_DIR = REPO_ROOT / "conf" / "arm"
ARMS_PACKAGE = "harness.arms"
ENTRY_POINT_GROUP = "offload_harness.arms"

_admitted: set[str] = set()  # dotted paths the driver admitted in this process


@lru_cache(maxsize=None)
def conf_targets() -> dict[str, str]:
    """name -> dotted path of every arm in conf/arm/ (each a class of the arms package)."""
    targets = {}
    for path in sorted(ARM_CONF_DIR.glob("*.yaml")):
        arm_cfg = yaml.safe_load(path.read_text())
        target = str(arm_cfg[TARGET])
        if not target.startswith(f"{ARMS_PACKAGE}."):
            raise ConfigError(f"arm.{TARGET}", f"conf/arm/{path.name} names {target!r}, not a class of {ARMS_PACKAGE}")
        targets[arm_cfg["name"]] = target
    return targets


@lru_cache(maxsize=None)
def entry_targets() -> dict[str, str]:
    """name -> dotted path of every installed entry point whose name conf/arm/ does not have (its class stays)."""
    return {entry.name: f"{entry.module}.{entry.attr}"
            for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
            if entry.name not in conf_targets()}


def admit(target: str) -> None:
    """A dotted path the driver's own command line chose (harness.arms.admit imports its class)."""
    _admitted.add(target)


def is_known(target: str) -> bool:
    """Whether a dotted path names a known arm class (registered or admitted), without importing it."""
    return target in conf_targets().values() or target in entry_targets().values() or target in _admitted


def unknown_target(target: str) -> ConfigError:
    """The error of a `_target_` that names no known arm class."""
    return ConfigError(f"arm.{TARGET}", f"unknown arm class {target!r}: not an arm of {ARMS_PACKAGE}, of an entry "
                       f"point ({ENTRY_POINT_GROUP}) or of the driver's command line")
