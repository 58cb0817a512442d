"""Refuse bad configs before anything is launched, with one line that names the offending key.

Every key of every group is checked whatever the arm: first each value alone (its type, finiteness and range, as
the config schema in harness/contract/schema/ declares them), then the rules that tie keys together (model shapes, steps
that must exist), the machine's limits and the arm's own rules.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from harness import arms
from harness.contract import schema
from harness.contract.errors import ConfigError


def check_machine(config: schema.Config, gpu_count: int | None) -> None:
    """What this node can run: no more ranks than GPUs, and fp16 only with CUDA (its loss scaling is CUDA's)."""
    ranks = config.launcher.nproc_per_node
    if gpu_count and ranks > gpu_count:
        raise ConfigError("launcher.nproc_per_node", f"{ranks} ranks per node but this node has {gpu_count} GPUs")
    if gpu_count == 0 and config.train.dtype == "fp16":
        raise ConfigError("train.dtype", "fp16 needs CUDA and this node has no GPU; on CPU train in bf16 or fp32")


def validate(cfg: dict[str, Any], gpu_count: int | None) -> schema.Config:
    """All checks, and the config typed; `gpu_count` is the node's GPU count (0 on a CPU machine, None where the
    machine is not the one that will run the point, as for the dry-run estimate)."""
    schema.check_values(cfg, arms.check_knobs)
    config = schema.typed(cfg, arms.from_config(cfg["arm"]))
    schema.check_rules(config)
    check_machine(config, gpu_count)
    config.arm.check(config)
    return config


# Config groups a command line may choose from, and the folder holding each one's options.
_GROUP_DIRS = {"model": "conf/model", "arm": "conf/arm", "train": "conf/train", "offload": "conf/offload",
               "launcher": "conf/launcher", "logger": "conf/logger", "experiments": "experiments"}


def added_config_dirs(args: list[str]) -> list[Path]:
    """Config dirs a command line adds to Hydra's search path (`--config-dir DIR`, `-cd DIR`): an arm or a
    model kept outside the repo has its YAML in DIR/arm/, DIR/model/, ..."""
    dirs = [Path(value) for flag, value in zip(args, args[1:]) if flag in ("--config-dir", "-cd")]
    return dirs + [Path(arg.partition("=")[2]) for arg in args if arg.startswith("--config-dir=")]


def check_group_choices(args: list[str], repo_root) -> None:
    """Unknown group options (`arm=foo`), caught before Hydra so the error is one line naming the group."""
    added = added_config_dirs(args)
    for override in args:
        key, sep, value = override.lstrip("+~").partition("=")
        if not sep or key not in _GROUP_DIRS or any(c in value for c in "()[]{}*"):
            continue
        group_dirs = [repo_root / _GROUP_DIRS[key], *(config_dir / key for config_dir in added)]
        options = sorted({p.stem for group_dir in group_dirs for p in group_dir.glob("*.yaml")})
        for choice in value.split(","):
            if choice and choice != "null" and choice not in options:
                raise ConfigError(key, f"unknown option {choice!r}; available: {', '.join(options)}")
