"""The config schema: the one place that says which values each config key allows, and the checks beside them.

One dataclass per group (groups.py); the arm group's is the arm's own class (harness/arms/: its fields are its
knobs), so each arm's knobs are checked by the arm that has them: the validation hands the schema that check
(`check_values`) and the typed config with its arm (`typed`, then `check_rules`), and the schema never imports an
arm. The validation, the offload pass and its runtime, the planner CLI and `harness bench` read allowed values from
here (`choices`), never from a copy.

Not registered with Hydra's ConfigStore, on purpose. The installed OmegaConf refuses `typing.Literal` field types,
and a schema in the composed config would make Hydra refuse a bad value while composing, before this validation:
as a multi-line Hydra error rather than one line naming the key, and in a sweep by ending the whole sweep where
the harness records that point as `config_error` and goes on. So the dataclasses are read by our own checker.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from harness.contract import protocol
from harness.contract.errors import ConfigError

from harness.contract.schema.config import GROUPS, Config, typed
from harness.contract.schema.fields import columns, check_fields, choices, refuse_unknown_keys, rules
from harness.contract.schema.groups import (BudgetConfig, DebugConfig, EnvConfig, Group, LauncherConfig, LoggerConfig,
                                   ModelConfig, OffloadConfig, SweepConfig, TrainConfig, budget_given)

__all__ = ["GROUPS", "Config", "typed",
           "BudgetConfig", "OffloadConfig", "TrainConfig", "ModelConfig", "DebugConfig", "EnvConfig",
           "LauncherConfig", "LoggerConfig", "SweepConfig", "check_group", "check_values", "check_rules",
           "budget_given", "choices", "config_columns", "pass_knobs"]



def config_columns() -> dict[str, str]:
    """Dotted config key -> its analysis column, for every key the schema marks as one (Column), group by group."""
    return {f"{name}.{key}": column for name, group in GROUPS.items() for key, column in columns(group).items()}


def check_values(cfg: Mapping[str, Any], check_arm: Callable[[Mapping[str, Any]], None]) -> None:
    """Each value alone, in every group whatever the arm: its type, finiteness, range or choice; a key (or group)
    the schema does not have is refused. `check_arm` checks the arm group's values by its class
    (harness.arms.check_knobs)."""
    refuse_unknown_keys("", cfg, ["arm", *GROUPS])
    if "arm" not in cfg:
        raise ConfigError("arm", "missing")
    if not isinstance(cfg["arm"], Mapping):
        raise ConfigError("arm", f"must be a section of keys, got {cfg['arm']!r}")
    check_arm(cfg["arm"])
    for name, group in GROUPS.items():
        check_fields(name, group, cfg.get(name))


def check_rules(config: Config) -> None:
    """The rules that tie keys together, once every value alone has passed (the arm's own: arms.Arm.check); the
    steps where the arm's phases begin (Arm.phase_start_steps) settle the point's step count. The groups' rules
    read the dict as written: they also check a group alone (check_group), as the planner's CLI hands it."""
    for group in GROUPS.values():
        group.check(config.written)
    steps = protocol.step_counts(config.train, config.arm.phase_start_steps(config)).total
    DebugConfig.check_steps(config.written, steps)


def check_group(name: str, cfg: Mapping[str, Any], part: type[Group] | None = None) -> None:
    """One group's values and rules (`part`: a part of the group's schema, such as the offload budget alone)."""
    group = part or GROUPS[name]
    check_fields(name, group, cfg[name])
    group.check(cfg)


def pass_knobs() -> tuple[str, ...]:
    """Our pass's knobs: the offload group's keys other than the budget's, in field order."""
    budget = rules(BudgetConfig)
    return tuple(name for name in rules(OffloadConfig) if name not in budget)
