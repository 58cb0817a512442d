"""The config schema: the one place that says which values each config key allows, and the checks beside them.

One dataclass per group (groups.py); the arm group's is the arm's own class (harness/arms/: its fields are its
knobs), so each arm's knobs are checked by the arm that has them. The validation, the offload pass and its
runtime, the planner CLI and `harness bench` read allowed values from here (`choices`), never from a copy.

Not registered with Hydra's ConfigStore, on purpose. The installed OmegaConf refuses `typing.Literal` field types,
and a schema in the composed config would make Hydra refuse a bad value while composing, before this validation:
as a multi-line Hydra error rather than one line naming the key, and in a sweep by ending the whole sweep where
the harness records that point as `config_error` and goes on. So the dataclasses are read by our own checker.
"""
from __future__ import annotations

from typing import Any, Mapping

from harness.contract.errors import ConfigError

from harness.contract.schema.fields import columns, check_fields, check_value, choices, refuse_unknown_keys, rules
from harness.contract.schema.groups import (BudgetConfig, DebugConfig, EnvConfig, Group, LauncherConfig, LoggerConfig,
                                   ModelConfig, OffloadConfig, SweepConfig, TrainConfig, budget_given)

__all__ = ["GROUPS", "BudgetConfig", "OffloadConfig", "TrainConfig", "ModelConfig", "DebugConfig", "EnvConfig",
           "LauncherConfig", "LoggerConfig", "SweepConfig", "check_group", "check_values", "check_rules",
           "budget_given", "choices", "config_columns", "pass_knobs"]

GROUPS: dict[str, type[Group]] = {
    "model": ModelConfig, "train": TrainConfig, "offload": OffloadConfig, "launcher": LauncherConfig,
    "logger": LoggerConfig, "env": EnvConfig, "debug": DebugConfig, "sweep": SweepConfig,
}


def config_columns() -> dict[str, str]:
    """Dotted config key -> its analysis column, for every key the schema marks as one (Column), group by group."""
    return {f"{name}.{key}": column for name, group in GROUPS.items() for key, column in columns(group).items()}


def check_values(cfg: Mapping[str, Any]) -> None:
    """Each value alone, in every group whatever the arm: its type, finiteness, range or choice; a key (or group)
    the schema does not have is refused."""
    refuse_unknown_keys("", cfg, ["arm", *GROUPS])
    if "arm" not in cfg:
        raise ConfigError("arm", "missing")
    check_arm_values(cfg["arm"])
    for name, group in GROUPS.items():
        check_fields(name, group, cfg.get(name))


def check_rules(cfg: Mapping[str, Any]) -> None:
    """The rules that tie keys together, once every value alone has passed (the arm's own: arms.Arm.check)."""
    for group in GROUPS.values():
        group.check(cfg)


def check_group(name: str, cfg: Mapping[str, Any], part: type[Group] | None = None) -> None:
    """One group's values and rules (`part`: a part of the group's schema, such as the offload budget alone)."""
    group = part or GROUPS[name]
    check_fields(name, group, cfg[name])
    group.check(cfg)


def check_arm_values(arm_cfg: Mapping[str, Any]) -> None:
    """The arm's knobs by its class; a knob of another arm that a campaign sets for every arm (arm.schedule under
    arm=zero3) is checked as that arm checks it."""
    from harness import arms  # here only: the planner and the offload runtime read the schema without the registry

    if not isinstance(arm_cfg, Mapping):
        raise ConfigError("arm", f"must be a section of keys, got {arm_cfg!r}")
    own = arms.class_of(arm_cfg)
    other_knobs = [name for other in arms.registered().values() for name in rules(other)]
    check_fields("arm", own, arm_cfg, also_known=[arms.TARGET, *other_knobs])
    for other in arms.registered().values():
        for name, rule in rules(other).items():
            if name in arm_cfg and name not in rules(own) and rule.check is not None:
                check_value(f"arm.{name}", rule, arm_cfg[name])


def pass_knobs() -> tuple[str, ...]:
    """Our pass's knobs: the offload group's keys other than the budget's, in field order."""
    budget = rules(BudgetConfig)
    return tuple(name for name in rules(OffloadConfig) if name not in budget)
