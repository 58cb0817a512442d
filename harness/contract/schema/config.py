"""A validated point's config, typed: one frozen dataclass per group, read by field from the validation on.

The dict stays where it is the run-file format: config.yaml as written, the W&B config, the summary's labels, and
analysis reading committed run dirs. `typed` builds the dataclasses from a dict that passed the validation's value
checks (harness/contract/schema/__init__.py: check_values)."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from harness.contract.schema.fields import rules
from harness.contract.schema.groups import (DebugConfig, EnvConfig, Group, LauncherConfig, LoggerConfig, ModelConfig,
                                            OffloadConfig, SweepConfig, TrainConfig)

GROUPS: dict[str, type[Group]] = {  # every group but the arm's, whose schema is the arm's class
    "model": ModelConfig, "train": TrainConfig, "offload": OffloadConfig, "launcher": LauncherConfig,
    "logger": LoggerConfig, "env": EnvConfig, "debug": DebugConfig, "sweep": SweepConfig,
}


@dataclasses.dataclass(frozen=True)
class Config:
    """One point's config by group; `arm` is the arm itself (its class in harness/arms/ is the arm group's schema),
    `written` the resolved dict the groups were read from (config.yaml's form)."""
    arm: Any
    model: ModelConfig
    train: TrainConfig
    offload: OffloadConfig
    launcher: LauncherConfig
    logger: LoggerConfig
    env: EnvConfig
    debug: DebugConfig
    sweep: SweepConfig
    written: Mapping[str, Any] = dataclasses.field(repr=False, compare=False)

    @property
    def world_size(self) -> int:
        """Ranks over all nodes."""
        return self.launcher.nnodes * self.launcher.nproc_per_node


def group_of(schema: type, values: Mapping[str, Any]) -> Any:
    """One group's dataclass from its checked values; a key only some options have (SOMETIMES) reads as null where
    absent, and a nested section (model.config) is its own dataclass."""
    fields = {}
    for name, rule in rules(schema).items():
        value = values.get(name)
        fields[name] = group_of(rule.check, value) if isinstance(rule.check, type) else value
    return schema(**fields)


def typed(cfg: Mapping[str, Any], arm: Any) -> Config:
    """The typed config of a resolved config whose values passed the validation, with its arm (arms.from_config)."""
    return Config(arm=arm, written=cfg, **{name: group_of(schema, cfg[name]) for name, schema in GROUPS.items()})
