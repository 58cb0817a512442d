"""Refuse bad configs before anything is launched, with one line that names the offending key."""
from __future__ import annotations

from typing import Any

from harness import arms, emulated_device
from harness.budget import check_budget_keys, is_finite_number
from harness.errors import ConfigError
from harness.models import FAMILIES

FAULTS = (None, "kill", "oom", "hang", "slow")
LOGGERS = ("wandb", "none")
_POSITIVE_TRAIN_KEYS = ("steps", "micro_batch", "seq_len", "grad_accum")


def _require_positive_int(section: dict, section_name: str, key: str) -> None:
    value = section.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{section_name}.{key}", f"must be a positive integer, got {value!r}")


def check_train(cfg: dict[str, Any]) -> None:
    train = cfg["train"]
    for key in _POSITIVE_TRAIN_KEYS:
        _require_positive_int(train, "train", key)
    max_positions = cfg["model"]["config"].get("max_position_embeddings")
    if max_positions is not None and train["seq_len"] > max_positions:
        raise ConfigError("train.seq_len", f"{train['seq_len']} exceeds the model's max_position_embeddings {max_positions}")
    if not isinstance(train["repeat"], int) or train["repeat"] < 0:
        raise ConfigError("train.repeat", f"must be an integer >= 0, got {train['repeat']!r}")
    bucket = train["reduce_bucket_size"]
    if bucket is not None and not (is_finite_number(bucket) and bucket >= 1 and float(bucket).is_integer()):
        raise ConfigError("train.reduce_bucket_size", f"must be null or a whole number of elements >= 1, got {bucket!r}")


def check_model(cfg: dict[str, Any]) -> None:
    model = cfg["model"]
    if model.get("family") not in FAMILIES:
        raise ConfigError("model.family", f"must be one of {FAMILIES}, got {model.get('family')!r}")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if key not in model.get("config", {}):
            raise ConfigError(f"model.config.{key}", "missing")


def check_launcher(cfg: dict[str, Any], gpu_count: int | None) -> None:
    launcher = cfg["launcher"]
    _require_positive_int(launcher, "launcher", "nproc_per_node")
    _require_positive_int(launcher, "launcher", "nnodes")
    if not launcher.get("timeout_s") or launcher["timeout_s"] <= 0:
        raise ConfigError("launcher.timeout_s", f"must be > 0, got {launcher.get('timeout_s')!r}")
    if gpu_count and launcher["nproc_per_node"] > gpu_count:
        raise ConfigError("launcher.nproc_per_node",
                          f"{launcher['nproc_per_node']} ranks per node but this node has {gpu_count} GPUs")


def bad_debug_step(debug: dict[str, Any], steps: int) -> str | None:
    """The first debug.*_step key (a step to look inside) that is neither null nor a step of the run."""
    for key in ("profile_step", "memory_trace_step"):
        value = debug.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < steps):
            return key
    return None


def check_env(cfg: dict[str, Any]) -> None:
    cap = cfg["env"]["reserved_cap_gb"]
    if cap is not None and not (is_finite_number(cap) and cap > 0):
        raise ConfigError("env.reserved_cap_gb", f"must be null or a finite number > 0, got {cap!r}")
    emulated_device.check(cfg["env"], physical_bytes=None)  # the driver checks it against its GPU too


def check_misc(cfg: dict[str, Any]) -> None:
    debug = cfg["debug"]
    if debug["fault"] not in FAULTS:
        raise ConfigError("debug.fault", f"must be one of {FAULTS}, got {debug['fault']!r}")
    bad_step = bad_debug_step(debug, cfg["train"]["steps"])
    if bad_step is not None:
        raise ConfigError(f"debug.{bad_step}",
                          f"must be null or a step in [0, train.steps={cfg['train']['steps']}), got {debug[bad_step]!r}")
    if cfg["logger"]["name"] not in LOGGERS:
        raise ConfigError("logger.name", f"must be one of {LOGGERS}, got {cfg['logger']['name']!r}")


def validate(cfg: dict[str, Any], gpu_count: int | None) -> None:
    """All checks; `gpu_count` is the node's GPU count (None or 0 on a CPU machine)."""
    arms.arm_spec(cfg["arm"]["name"])
    check_model(cfg)
    check_train(cfg)
    off = cfg["offload"]
    check_budget_keys(off["budget_gb"], off["budget_fraction"], off["margin"])
    check_launcher(cfg, gpu_count)
    check_env(cfg)
    check_misc(cfg)
    arms.check_arm_config(cfg)


# Config groups a command line may choose from, and the folder holding each one's options.
_GROUP_DIRS = {"model": "conf/model", "arm": "conf/arm", "train": "conf/train", "offload": "conf/offload",
               "launcher": "conf/launcher", "logger": "conf/logger", "experiments": "experiments"}


def check_group_choices(overrides: list[str], repo_root) -> None:
    """Unknown group options (`arm=foo`), caught before Hydra so the error is one line naming the group."""
    for override in overrides:
        key, sep, value = override.lstrip("+~").partition("=")
        if not sep or key not in _GROUP_DIRS or any(c in value for c in "()[]{}*"):
            continue
        options = sorted(p.stem for p in (repo_root / _GROUP_DIRS[key]).glob("*.yaml"))
        for choice in value.split(","):
            if choice and choice != "null" and choice not in options:
                raise ConfigError(key, f"unknown option {choice!r}; available: {', '.join(options)}")
