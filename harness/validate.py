"""Refuse bad configs before anything is launched, with one line that names the offending key.

Every key of every group is checked whatever the arm: first each value alone (its type, finiteness and range,
from the tables below), then the rules that tie keys together (model shapes, steps that must exist).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from harness import arms, emulated_device, offload
from harness.checks import BOOL, NULL_OR_POSITIVE, POSITIVE, POSITIVE_INT, Choice, Number, check_keys
from harness.errors import ConfigError
from harness.models import FAMILIES

FAULTS = (None, "kill", "oom", "hang", "slow")
LOGGERS = ("wandb", "none")
NULL_OR_STEP = Number(low=0, integer=True, nullable=True)

# Keys every config has.
REQUIRED_KEYS = {
    "model.family": Choice(FAMILIES),
    "train.micro_batch": POSITIVE_INT, "train.seq_len": POSITIVE_INT, "train.steps": POSITIVE_INT,
    "train.grad_accum": POSITIVE_INT,
    "train.dtype": Choice(arms.DTYPES),
    "train.lr": POSITIVE,
    "train.seed": Number(integer=True),
    "train.repeat": Number(low=0, integer=True),
    "train.sub_group_size": Number(low=1, whole=True, nullable=True),  # null: DeepSpeed's default
    "train.reduce_bucket_size": Number(low=1, whole=True, nullable=True),
    "train.torch_adam": Choice((None, True, False)),
    "launcher.nproc_per_node": POSITIVE_INT, "launcher.nnodes": POSITIVE_INT,
    "launcher.timeout_s": POSITIVE,
    "launcher.stall_timeout_s": NULL_OR_POSITIVE,
    "debug.fault": Choice(FAULTS),
    "debug.fault_step": Number(low=0, integer=True), "debug.fault_rank": Number(low=0, integer=True),
    "debug.fault_sleep_s": Number(low=0),
    "debug.profile_step": NULL_OR_STEP, "debug.memory_trace_step": NULL_OR_STEP,
    "debug.copy_delay_us": Number(low=0, high=1_000_000, integer=True),
    "logger.name": Choice(LOGGERS),
}

# Keys that only some options of a group have (an arm's own knobs, a launcher's or logger's settings).
KEYS_WHEN_PRESENT = {
    "arm.compile_backend": Choice(("inductor", "eager")),
    "arm.schedule": Choice(("default", "z3_only")),
    "arm.variant": Choice(("async", "sync")),
    "arm.offload_optimizer": Choice((None, "cpu")),
    "launcher.dist_timeout_min": NULL_OR_POSITIVE,
    "launcher.rdzv_port": Number(low=1, high=65535, integer=True, nullable=True),
    "launcher.requeue": BOOL,
    "launcher.gpu_memory_gb": NULL_OR_POSITIVE,
    "logger.mode": Choice(("offline", "online", "disabled")),
}

# The env group: one entry per numeric key, with its range.
ENV_KEYS = {
    "env.device_memory_gb": NULL_OR_POSITIVE,
    "env.reserved_cap_gb": NULL_OR_POSITIVE,
}

# model.config: the dimensions transformers needs, and those it derives when absent or null.
NULL_OR_POSITIVE_INT = Number(low=1, integer=True, nullable=True)
MODEL_KEYS = {
    "model.config.hidden_size": POSITIVE_INT, "model.config.num_hidden_layers": POSITIVE_INT,
    "model.config.num_attention_heads": POSITIVE_INT, "model.config.vocab_size": Number(low=2, integer=True),
}
MODEL_KEYS_WHEN_PRESENT = {
    "model.config.intermediate_size": NULL_OR_POSITIVE_INT, "model.config.num_key_value_heads": NULL_OR_POSITIVE_INT,
    "model.config.head_dim": NULL_OR_POSITIVE_INT, "model.config.max_position_embeddings": NULL_OR_POSITIVE_INT,
    "model.config.rope_theta": NULL_OR_POSITIVE, "model.config.rms_norm_eps": NULL_OR_POSITIVE,
    "model.config.tie_word_embeddings": BOOL,
}


def check_model_shape(model_config: dict[str, Any]) -> None:
    """Heads must split the hidden size (unless head_dim sets their width) and kv heads must split the heads."""
    hidden, heads = model_config["hidden_size"], model_config["num_attention_heads"]
    if model_config.get("head_dim") is None and hidden % heads:
        raise ConfigError("model.config.num_attention_heads",
                          f"must divide hidden_size {hidden} (or set model.config.head_dim), got {heads}")
    kv_heads = model_config.get("num_key_value_heads")
    if kv_heads is not None and heads % kv_heads:
        raise ConfigError("model.config.num_key_value_heads",
                          f"must divide num_attention_heads {heads}, got {kv_heads}")


def check_train(cfg: dict[str, Any]) -> None:
    train = cfg["train"]
    max_positions = cfg["model"]["config"].get("max_position_embeddings")
    if max_positions is not None and train["seq_len"] > max_positions:
        raise ConfigError("train.seq_len", f"{train['seq_len']} exceeds the model's max_position_embeddings {max_positions}")


def check_launcher(cfg: dict[str, Any], gpu_count: int | None) -> None:
    launcher = cfg["launcher"]
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
    check_keys(cfg, ENV_KEYS)
    emulated_device.check(cfg["env"], physical_bytes=None)  # the driver checks it against its GPU too


def check_debug(cfg: dict[str, Any]) -> None:
    debug = cfg["debug"]
    bad_step = bad_debug_step(debug, cfg["train"]["steps"])
    if bad_step is not None:
        raise ConfigError(f"debug.{bad_step}",
                          f"must be null or a step in [0, train.steps={cfg['train']['steps']}), got {debug[bad_step]!r}")


def check_values(cfg: dict[str, Any]) -> None:
    """Each value alone: type, finiteness, range, allowed options."""
    arms.from_config(cfg["arm"])  # an unknown arm, or one missing a knob, first
    check_keys(cfg, REQUIRED_KEYS)
    check_keys(cfg, KEYS_WHEN_PRESENT, required=False)
    check_keys(cfg, MODEL_KEYS)
    check_keys(cfg, MODEL_KEYS_WHEN_PRESENT, required=False)
    offload.check_knobs(cfg["offload"])
    check_env(cfg)


def validate(cfg: dict[str, Any], gpu_count: int | None) -> None:
    """All checks; `gpu_count` is the node's GPU count (None or 0 on a CPU machine)."""
    check_values(cfg)
    check_model_shape(cfg["model"]["config"])
    check_train(cfg)
    check_launcher(cfg, gpu_count)
    check_debug(cfg)
    arms.from_config(cfg["arm"]).check(cfg)


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
