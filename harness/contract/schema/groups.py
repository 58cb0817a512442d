"""One dataclass per config group: each field is one key of conf/<group>/ (its default lives there), its type the
values it allows (harness/contract/schema/fields.py says how to read them); `check` holds the rules that tie a group's keys
together or to other groups', run once every value alone has passed. A new key is one field line here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Mapping, Optional

from harness.contract.checks import POSITIVE, POSITIVE_INT, Number, PlainName, is_finite_number
from harness.contract.errors import ConfigError
from harness.contract.units import GB
from harness.contract.schema.fields import COLUMN, SOMETIMES, Column

COUNT = Number(low=0, integer=True)  # a step, a rank, a count
WHOLE_ELEMENTS = Number(low=1, whole=True)  # an element count such as 5e7 (null: DeepSpeed's default)


class Group:
    """A config group's schema."""

    @classmethod
    def check(cls, cfg: Mapping[str, Any]) -> None:
        """Rules over several keys (of the whole config); raises ConfigError naming the key at fault."""


@dataclass(frozen=True)
class ModelShape:
    """model.config: the dimensions transformers needs, and those it derives when absent or null."""
    hidden_size: Annotated[int, POSITIVE_INT]
    num_hidden_layers: Annotated[int, POSITIVE_INT]
    num_attention_heads: Annotated[int, POSITIVE_INT]
    vocab_size: Annotated[int, Number(low=2, integer=True)]
    intermediate_size: Annotated[Optional[int], POSITIVE_INT, SOMETIMES]
    num_key_value_heads: Annotated[Optional[int], POSITIVE_INT, SOMETIMES]
    head_dim: Annotated[Optional[int], POSITIVE_INT, SOMETIMES]
    max_position_embeddings: Annotated[Optional[int], POSITIVE_INT, SOMETIMES]
    rope_theta: Annotated[Optional[float], POSITIVE, SOMETIMES]
    rms_norm_eps: Annotated[Optional[float], POSITIVE, SOMETIMES]
    tie_word_embeddings: Annotated[bool, SOMETIMES]


@dataclass(frozen=True)
class ModelConfig(Group):
    name: Annotated[str, Column("model")]
    family: Literal["qwen3", "llama"]
    config: ModelShape

    @classmethod
    def check(cls, cfg: Mapping[str, Any]) -> None:
        """Heads must split the hidden size (unless head_dim sets their width) and kv heads must split the heads."""
        shape = cfg["model"]["config"]
        hidden, heads = shape["hidden_size"], shape["num_attention_heads"]
        if shape.get("head_dim") is None and hidden % heads:
            raise ConfigError("model.config.num_attention_heads",
                              f"must divide hidden_size {hidden} (or set model.config.head_dim), got {heads}")
        kv_heads = shape.get("num_key_value_heads")
        if kv_heads is not None and heads % kv_heads:
            raise ConfigError("model.config.num_key_value_heads",
                              f"must divide num_attention_heads {heads}, got {kv_heads}")


@dataclass(frozen=True)
class TrainConfig(Group):
    micro_batch: Annotated[int, POSITIVE_INT, COLUMN]
    seq_len: Annotated[int, POSITIVE_INT, COLUMN]
    warmup_steps: Annotated[int, COUNT, COLUMN]
    measure_steps: Annotated[Optional[int], POSITIVE_INT, COLUMN]
    steps: Annotated[Optional[int], POSITIVE_INT, COLUMN]  # the total; null: from the arm's phases (harness/contract/protocol.py)
    grad_accum: Annotated[int, POSITIVE_INT, COLUMN]
    dtype: Annotated[Literal["bf16", "fp16", "fp32"], COLUMN]
    lr: Annotated[float, POSITIVE]
    seed: Annotated[int, Number(integer=True), COLUMN]
    repeat: Annotated[int, COUNT, COLUMN]
    sub_group_size: Annotated[Optional[float], WHOLE_ELEMENTS]
    reduce_bucket_size: Annotated[Optional[float], WHOLE_ELEMENTS]
    torch_adam: Optional[bool]

    @classmethod
    def check(cls, cfg: Mapping[str, Any]) -> None:
        train = cfg["train"]
        if (train["steps"] is None) == (train["measure_steps"] is None):
            raise ConfigError("train.steps", "set train.measure_steps (the final phase's measured steps; the total "
                              "follows from the arm's phases) or train.steps (the total, with train.measure_steps=null)"
                              f", not {'both' if train['steps'] is not None else 'neither'}")
        seq_len, max_positions = cfg["train"]["seq_len"], cfg["model"]["config"].get("max_position_embeddings")
        if max_positions is not None and seq_len > max_positions:
            raise ConfigError("train.seq_len", f"{seq_len} exceeds the model's max_position_embeddings {max_positions}")


@dataclass(frozen=True)
class BudgetConfig(Group):
    """The offload budget every offload arm plans against (resolved to bytes once, harness/contract/budget.py)."""
    budget_gb: Annotated[Optional[float], Number(low=0), COLUMN]
    budget_fraction: Annotated[Optional[float], Number(low=0, high=1), COLUMN]
    margin: Annotated[float, Number(low=0, high=1, high_open=True), COLUMN]

    @classmethod
    def check(cls, cfg: Mapping[str, Any]) -> None:
        offload = cfg["offload"]
        if offload["budget_gb"] is not None and offload["budget_fraction"] is not None:
            raise ConfigError("offload.budget_gb", "set at most one of offload.budget_gb and offload.budget_fraction")


def budget_given(offload: Mapping[str, Any]) -> bool:
    """Whether the offload group gives a budget (offload.budget_gb or .budget_fraction set); without one, the auto
    rule decides. A key missing (a run recorded before it) reads as null."""
    return offload.get("budget_gb") is not None or offload.get("budget_fraction") is not None


@dataclass(frozen=True)
class OffloadConfig(BudgetConfig):
    """The offload group: the budget, then our pass's knobs (arm=offload; DeepSpeed's pass has them hard-wired)."""
    mode: Annotated[Literal["async", "blocking"], Column("offload_mode")]
    empty_cache: Annotated[Literal["never", "once_per_phase", "per_step"], COLUMN]
    streams: Annotated[Literal["split", "single"], COLUMN]
    reload: Annotated[Literal["asap", "at_end"], COLUMN]
    release: Annotated[Literal["recorded", "ordered"], COLUMN]
    evict_from: Annotated[Literal["start", "planning_step"], COLUMN]
    auto_rule: Annotated[Literal["margin", "device_limit"], COLUMN]
    budget_rule: Annotated[Literal["deepspeed", "step_model"], COLUMN]
    peak_cap_gb: Annotated[Optional[float], Number(low=0), COLUMN]
    compose: Annotated[Literal["none", "prefetch", "prefetch_selective_gather"], COLUMN]  # DeepCompile's passes beside ours
    if_infeasible: Annotated[Literal["run", "refuse"], COLUMN]  # a plan predicted over its budget: run it, flagged

    @classmethod
    def check(cls, cfg: Mapping[str, Any]) -> None:
        super().check(cfg)
        if cfg["offload"]["release"] == "ordered" and cfg["offload"]["mode"] == "blocking":
            raise ConfigError("offload.release", "ordered release needs mode=async (blocking copies all out and waits)")
        if cfg["offload"]["budget_rule"] == "step_model" and cfg["offload"]["peak_cap_gb"] is not None:
            raise ConfigError("offload.peak_cap_gb", "budget_rule=step_model places reloads and releases under the "
                              "peak it plans to fit; a cap applies to budget_rule=deepspeed only")


@dataclass(frozen=True)
class LauncherConfig(Group):
    nproc_per_node: Annotated[int, POSITIVE_INT, COLUMN]
    nnodes: Annotated[int, POSITIVE_INT, COLUMN]
    timeout_s: Annotated[float, POSITIVE]
    stall_timeout_s: Annotated[Optional[float], POSITIVE]
    # No step within this long of the launch ends the point as `timeout` (null: off). Start-up, the model's build,
    # DeepSpeed's JIT op builds and the first step's compile all count: 900 s clears a cold GPU point (about 25 s of
    # start-up, 60-100 s of first compile) with minutes to spare for op builds on a fresh machine, and still ends
    # a point stuck before step 0 (on a build lock nobody releases, say) long before timeout_s.
    startup_timeout_s: Annotated[Optional[float], POSITIVE]
    rdzv_backend: Optional[Literal["c10d", "static"]]  # null: torchrun --standalone
    rdzv_endpoint: Optional[str]
    rdzv_port: Annotated[Optional[int], Number(low=1, high=65535, integer=True), SOMETIMES]
    dist_timeout_min: Annotated[Optional[float], POSITIVE, SOMETIMES]
    requeue: Annotated[bool, SOMETIMES]
    gpu_memory_gb: Annotated[Optional[float], POSITIVE, SOMETIMES]
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"]  # the harness's logger (harness/contract/logs.py)


@dataclass(frozen=True)
class LoggerConfig(Group):
    name: Literal["wandb", "none"]
    mode: Annotated[Literal["offline", "online", "disabled"], SOMETIMES]  # wandb's keys
    project: Annotated[Optional[str], SOMETIMES]
    entity: Annotated[Optional[str], SOMETIMES]


@dataclass(frozen=True)
class EnvConfig(Group):
    pytorch_cuda_alloc_conf: Optional[str]
    device_memory_gb: Annotated[Optional[float], POSITIVE, COLUMN]  # the emulated size (null: the real device)
    reserved_cap_gb: Annotated[Optional[float], POSITIVE]

    @classmethod
    def check(cls, cfg: Mapping[str, Any]) -> None:
        check_emulated_size(cfg["env"], physical_bytes=None)  # the driver checks it against its GPU too


def check_emulated_size(env_cfg: Mapping[str, Any], physical_bytes: int | None) -> None:
    """Refuse a size that cannot mean anything: not a finite number > 0, larger than the real device, or
    smaller than the reserved-memory ceiling measured inside it."""
    size = env_cfg.get("device_memory_gb")
    if size is None:
        return
    if not (is_finite_number(size) and size > 0):
        raise ConfigError("env.device_memory_gb", f"must be null or a finite number > 0, got {size!r}")
    if physical_bytes is not None and size * GB > physical_bytes:
        raise ConfigError("env.device_memory_gb", f"{size:g} GB is more than this device's "
                          f"{physical_bytes / GB:.2f} GB; an emulated device can only be smaller")
    cap = env_cfg.get("reserved_cap_gb")
    if is_finite_number(cap) and cap > size:
        raise ConfigError("env.reserved_cap_gb", f"{cap:g} GB is above the emulated device "
                          f"(env.device_memory_gb={size:g}); a ceiling inside it must be smaller")


@dataclass(frozen=True)
class DebugConfig(Group):
    fault: Optional[Literal["kill", "oom", "hang", "slow"]]
    fault_step: Annotated[int, COUNT]
    fault_rank: Annotated[int, COUNT]
    fault_sleep_s: Annotated[float, Number(low=0)]
    profile_step: Annotated[Optional[int], COUNT]
    memory_trace_step: Annotated[Optional[int], COUNT]
    copy_delay_us: Annotated[int, Number(low=0, high=1_000_000, integer=True)]

    @classmethod
    def check_steps(cls, cfg: Mapping[str, Any], steps: int) -> None:
        """A step to look inside must be a step of the run; a fault must strike a step and a rank the run has.
        `steps`: the optimizer steps the point runs (train.steps, or what the measurement protocol makes of the
        arm's phases), which the schema alone does not know; run after every group's `check`."""
        debug = cfg["debug"]
        for key in ("profile_step", "memory_trace_step"):
            value = debug[key]
            if value is not None and not value < steps:
                raise ConfigError(f"debug.{key}", f"must be null or a step in [0, train.steps={steps}), got {value!r}")
        if debug["fault"] is None:
            return
        if not debug["fault_step"] < steps:
            raise ConfigError("debug.fault_step", f"must be a step in [0, train.steps={steps}) for debug.fault="
                              f"{debug['fault']}, got {debug['fault_step']!r}")
        world_size = cfg["launcher"]["nnodes"] * cfg["launcher"]["nproc_per_node"]
        if not debug["fault_rank"] < world_size:
            raise ConfigError("debug.fault_rank", f"must be a rank in [0, world size {world_size}) for debug.fault="
                              f"{debug['fault']}, got {debug['fault_rank']!r}")


@dataclass(frozen=True)
class SweepConfig(Group):
    # the W&B group and the sweep folder's name: one folder under multirun/
    name: Annotated[str, PlainName(), Column("sweep_name")]
    strict: bool  # true: a multirun exits 1 when a point is not ok (false: when a point left no summary)
    reuse: bool  # true: a multirun's points reuse DeepCompile's profiles and compile caches (harness/rank/profile_cache.py)
