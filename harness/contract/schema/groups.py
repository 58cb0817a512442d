"""One dataclass per config group: each field is one key of conf/<group>/ (its default lives there), its type the
values it allows (harness/contract/schema/fields.py says how to read them), and the comment above it what it means
(conf/ keeps the defaults only); `check` holds the rules that tie a group's keys together or to other groups', run
once every value alone has passed. A new key is one field line here. The validation hands the driver, the ranks and
the arms these dataclasses (schema/config.py: Config); they read fields, never the config's dict."""
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
    """The training settings. Steps are optimizer steps, counted by the measurement protocol
    (harness/contract/protocol.py): each phase's first step compiles (or warms up) and `warmup_steps` more follow, all
    left out of the phase's statistics; the final phase then measures `measure_steps` steps. The total follows from
    where the arm's final phase starts, so every arm measures as many."""
    micro_batch: Annotated[int, POSITIVE_INT, COLUMN]  # sequences per rank per micro-step
    seq_len: Annotated[int, POSITIVE_INT, COLUMN]  # tokens per sequence
    warmup_steps: Annotated[int, COUNT, COLUMN]  # steps after each phase's compile step, left out of its statistics
    # The final phase's measured steps (the CPU default is 3; GPU campaigns measure 20 or more). The driver settles
    # it, and `steps`, before the point runs: config.yaml holds both.
    measure_steps: Annotated[Optional[int], POSITIVE_INT, COLUMN]
    # The total instead (then measure_steps: null): the final phase measures what is left; null: from the arm's
    # phases (harness/contract/protocol.py).
    steps: Annotated[Optional[int], POSITIVE_INT, COLUMN]
    grad_accum: Annotated[int, POSITIVE_INT, COLUMN]  # gradient accumulation steps per optimizer step
    dtype: Annotated[Literal["bf16", "fp16", "fp32"], COLUMN]
    lr: Annotated[float, POSITIVE]
    seed: Annotated[int, Number(integer=True), COLUMN]  # model init and synthetic tokens
    repeat: Annotated[int, COUNT, COLUMN]  # repeat index: run one point several times (-m train.repeat=0,1,2)
    # ZeRO-3 optimizer sub-group size (elements; null: DeepSpeed's 1e9).
    sub_group_size: Annotated[Optional[float], WHOLE_ELEMENTS]
    # ZeRO-3 gradient reduce bucket (elements; null: DeepSpeed's 5e8). DeepCompile holds two buckets of it in
    # backward and a receive buffer of up to one on its reduce stream.
    reduce_bucket_size: Annotated[Optional[float], WHOLE_ELEMENTS]
    # null: torch AdamW without CUDA (no fused-Adam build), DeepSpeed's fused Adam with it.
    torch_adam: Optional[bool]
    # What the host waits for at each step's start and end, so what a step's time covers. device (the protocol's):
    # every stream, so a step's time covers all the device work it queued. compute: the compute stream only, as a
    # loop that reads its loss each step waits; copies on other streams may run on into the next step, where the
    # compute stream waits for them only if it needs their data or memory.
    step_sync: Annotated[Literal["device", "compute"], COLUMN]
    # Python's garbage collector (harness/rank/garbage.py): auto (its own thresholds; a collection may land inside a
    # step, gc_s says how long) | between_steps (automatic collection off; a full one before each step's opening
    # sync, outside every step's time).
    gc: Annotated[Literal["auto", "between_steps"], COLUMN]

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
    """The memory budget every offload arm (ds_offload, offload) plans against, resolved to bytes once
    (harness/contract/budget.py)."""
    budget_gb: Annotated[Optional[float], Number(low=0), COLUMN]  # absolute budget, GB = 1e9 bytes
    # A fraction of device memory; at most one of budget_gb and budget_fraction.
    budget_fraction: Annotated[Optional[float], Number(low=0, high=1), COLUMN]
    # Auto budget = device total x (1 - margin), used when neither is set (DeepSpeed's rule).
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
    # async | blocking (copy all out before forward, all back after backward).
    mode: Annotated[Literal["async", "blocking"], Column("offload_mode")]
    empty_cache: Annotated[Literal["never", "once_per_phase", "per_step"], COLUMN]
    # split (separate D2H and H2D streams) | single (one copy stream, as DeepSpeed).
    streams: Annotated[Literal["split", "single"], COLUMN]
    reload: Annotated[Literal["asap", "at_end"], COLUMN]  # asap (as soon as the cap allows in backward) | at_end
    # When an offloaded state's device memory is reusable: recorded (record_stream: once the host sees its copy
    # done) | ordered (the compute stream waits for the copy at a planned forward node, then frees it: reserved
    # memory stays at the cap, compute may stall) | reclaimed (recorded, and at the planned forward node the host
    # waits for the copy, so the allocator's next request finds the block free: no retry for a block in flight).
    release: Annotated[Literal["recorded", "ordered", "reclaimed"], COLUMN]
    # start (every state to the host before step 0; phase 0's optimizer step brings each sub-group in for its update
    # and out again) | planning_step (first evicted at the planning step, as DeepSpeed's pass: phase 0 holds every
    # state, so it needs the most memory).
    evict_from: Annotated[Literal["start", "planning_step"], COLUMN]
    # When the planned states start out (mode=async): forward (the launch op at the forward's head, as DeepSpeed's
    # pass) | after_update (each sub-group's as soon as ZeRO-3 has queued its update: the copies overlap the rest of
    # the optimizer step, and their blocks are free before the forward's first request instead of while it runs).
    launch: Annotated[Literal["forward", "after_update"], COLUMN]
    # Our pass with neither budget set: device_limit (the least offload whose predicted peak fits the device less
    # the allocator overhead measured on the run and room for the step's largest request) | margin (the auto budget
    # above); DeepSpeed's pass always takes the margin.
    auto_rule: Annotated[Literal["margin", "device_limit"], COLUMN]
    # Our pass with a budget: step_model (the least offload whose predicted peak fits the budget and the device
    # rule's limit) | deepspeed (states kept resident sized against the profile's forward peak, as DeepSpeed's pass:
    # both arms move comparable bytes at one budget; campaigns recorded with it before step_model became the
    # default pin it).
    budget_rule: Annotated[Literal["deepspeed", "step_model"], COLUMN]
    # The device peak releases and asap reloads are planned under; null: the budget.
    peak_cap_gb: Annotated[Optional[float], Number(low=0), COLUMN]
    # DeepCompile's memory-spending passes beside ours: they run in our planning step, before our plan, which counts
    # what they hold within the one budget.
    compose: Annotated[Literal["none", "prefetch", "prefetch_selective_gather"], COLUMN]
    # A plan whose predicted peak exceeds its budget: run (it runs, and summary.json's over_budget_bytes flags the
    # point) | refuse (the point stops at the planning step, before the planned phase's step 0, recorded
    # config_error naming the shortfall).
    if_infeasible: Annotated[Literal["run", "refuse"], COLUMN]

    @classmethod
    def check(cls, cfg: Mapping[str, Any]) -> None:
        super().check(cfg)
        if cfg["offload"]["release"] != "recorded" and cfg["offload"]["mode"] == "blocking":
            raise ConfigError("offload.release", f"{cfg['offload']['release']} release needs mode=async (blocking "
                              "copies all out and waits)")
        if cfg["offload"]["launch"] != "forward" and cfg["offload"]["mode"] == "blocking":
            raise ConfigError("offload.launch", f"launch={cfg['offload']['launch']} needs mode=async (blocking copies "
                              "all out at the forward's head and waits)")
        if cfg["offload"]["budget_rule"] == "step_model" and cfg["offload"]["peak_cap_gb"] is not None:
            raise ConfigError("offload.peak_cap_gb", "budget_rule=step_model places reloads and releases under the "
                              "peak it plans to fit; a cap applies to budget_rule=deepspeed only")


@dataclass(frozen=True)
class LauncherConfig(Group):
    """How a point's ranks start: torchrun on each node (the basic Hydra launcher runs the points one after
    another; conf/launcher/slurm.yaml makes a sweep a SLURM job array)."""
    nproc_per_node: Annotated[int, POSITIVE_INT, COLUMN]  # ranks (GPUs) per node
    nnodes: Annotated[int, POSITIVE_INT, COLUMN]  # nodes per point; world size = nnodes x nproc_per_node
    timeout_s: Annotated[float, POSITIVE]  # the driver kills a point that runs longer and records it as timeout
    # ...or one that writes no new step for this long (null: off), counted from the first step; a phase's first
    # step (a compile) is not charged to it, only to timeout_s.
    stall_timeout_s: Annotated[Optional[float], POSITIVE]
    # ...or one that writes no step within this long of its launch (null: off): start-up, the model's build,
    # DeepSpeed's JIT op builds and the first step's compile all count: 900 s clears a cold GPU point (about 25 s of
    # start-up, 60-100 s of first compile) with minutes to spare for op builds on a fresh machine, and still ends
    # a point stuck before step 0 (on a build lock nobody releases, say) long before timeout_s.
    startup_timeout_s: Annotated[Optional[float], POSITIVE]
    # null: torchrun --standalone | c10d or static: a rendezvous (on localhost for one node; several nodes need
    # static, which fixes each node's ranks by its SLURM node id: node K holds ranks K x nproc_per_node and up,
    # torchrun --node_rank).
    rdzv_backend: Optional[Literal["c10d", "static"]]
    rdzv_endpoint: Optional[str]  # host:port; null: localhost and a free port (SLURM: the job's first host)
    # null: a free port on one node; on several, 29500 + the SLURM job id mod 2000 (all nodes of a job agree on it).
    rdzv_port: Annotated[Optional[int], Number(low=1, high=65535, integer=True), SOMETIMES]
    # The process-group (collective) timeout and the rendezvous join timeout: a dead rank or node ends the point
    # as `died`.
    dist_timeout_min: Annotated[Optional[float], POSITIVE, SOMETIMES]
    # SLURM: true, a preempted point goes back to the queue and runs again (earlier files -> attempts/N/); false,
    # its job is submitted --no-requeue, so SLURM cannot run a recorded point again.
    requeue: Annotated[bool, SOMETIMES]
    # Per GPU, for estimate_only=true's fit column (H200: 141); null: this machine's first GPU.
    gpu_memory_gb: Annotated[Optional[float], POSITIVE, SOMETIMES]
    # The harness log lines shown (harness/contract/logs.py); ranks prefix theirs with [rank N].
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"]

    @classmethod
    def check(cls, cfg: Mapping[str, Any]) -> None:
        """sweep.stop_at on one node only (here: the sweep group is also checked alone, for the sweep's name)."""
        if cfg["sweep"]["stop_at"] is not None and cfg["launcher"]["nnodes"] > 1:
            raise ConfigError("sweep.stop_at", f"one node only: with launcher.nnodes={cfg['launcher']['nnodes']} "
                              "the nodes could judge the time left differently and part of a point start")


@dataclass(frozen=True)
class LoggerConfig(Group):
    """Where a point is mirrored besides its run files (the source of truth)."""
    name: Literal["wandb", "none"]  # wandb: one W&B run per point (harness/driver/sinks.py)
    # wandb's keys: offline by default (`wandb sync` later).
    mode: Annotated[Literal["offline", "online", "disabled"], SOMETIMES]
    project: Annotated[Optional[str], SOMETIMES]
    entity: Annotated[Optional[str], SOMETIMES]


@dataclass(frozen=True)
class EnvConfig(Group):
    pytorch_cuda_alloc_conf: Optional[str]  # the ranks' PYTORCH_CUDA_ALLOC_CONF (null: left as it is)
    # Emulated device size, GB = 1e9 (null: the real device). Every rank behaves as if its GPU had this much memory
    # from before the model is built: the caching allocator is capped there (an allocation past it is a real CUDA
    # OOM, recorded `oom` with its step and phase) and DeepSpeed's accelerator reports it as the device's total to
    # DeepCompile's passes and to the offload budget. Memory outside the allocator (CUDA context, NCCL) is not counted.
    device_memory_gb: Annotated[Optional[float], POSITIVE, COLUMN]
    # Ceiling on each rank's reserved device memory from the final phase's first step on, GB = 1e9 (null: none;
    # earlier phases hold every optimizer state resident): a measurement tool, at most env.device_memory_gb. Past
    # it the caching allocator gives back unused cached blocks (a device sync; counted in steps.jsonl's
    # alloc_retries) instead of mapping more, so reserved memory cannot outgrow it; what still does not fit is an OOM.
    reserved_cap_gb: Annotated[Optional[float], POSITIVE]

    @classmethod
    def check(cls, cfg: Mapping[str, Any]) -> None:
        env = cfg["env"]  # the driver checks the size against its GPU too
        check_emulated_size(env.get("device_memory_gb"), env.get("reserved_cap_gb"), physical_bytes=None)


def check_emulated_size(size: Any, cap: Any, physical_bytes: int | None) -> None:
    """Refuse an emulated device size (env.device_memory_gb) that cannot mean anything: not a finite number > 0,
    larger than the real device, or smaller than the reserved-memory ceiling `cap` (env.reserved_cap_gb) measured
    inside it."""
    if size is None:
        return
    if not (is_finite_number(size) and size > 0):
        raise ConfigError("env.device_memory_gb", f"must be null or a finite number > 0, got {size!r}")
    if physical_bytes is not None and size * GB > physical_bytes:
        raise ConfigError("env.device_memory_gb", f"{size:g} GB is more than this device's "
                          f"{physical_bytes / GB:.2f} GB; an emulated device can only be smaller")
    if is_finite_number(cap) and cap > size:
        raise ConfigError("env.reserved_cap_gb", f"{cap:g} GB is above the emulated device "
                          f"(env.device_memory_gb={size:g}); a ceiling inside it must be smaller")


@dataclass(frozen=True)
class DebugConfig(Group):
    """Fault injection, to exercise the failure paths for real (tests, fixtures), and looks inside one step."""
    # The worker of global rank `fault_rank` SIGKILLs itself (kill), raises a CUDA out-of-memory error (oom) or
    # hangs (hang) at optimizer step `fault_step`, or sleeps `fault_sleep_s` inside that step (slow); null: none.
    fault: Optional[Literal["kill", "oom", "hang", "slow"]]
    fault_step: Annotated[int, COUNT]
    fault_rank: Annotated[int, COUNT]
    fault_sleep_s: Annotated[float, Number(low=0)]
    # Looks inside one optimizer step on rank 0 (harness/rank/diagnostics.py); that step's time is not a
    # measurement. profile_step: a torch.profiler trace, torch_trace.json and torch_ops.txt (where the time goes);
    # memory_trace_step: the caching allocator's history (CUDA), memory_snapshot.pickle and memory_trace.json, over
    # memory_trace_steps consecutive steps from that one (a window long enough to hold a retry that comes every
    # few steps; each traced step is left out of the measured ones).
    profile_step: Annotated[Optional[int], COUNT]
    memory_trace_step: Annotated[Optional[int], COUNT]
    memory_trace_steps: Annotated[int, Number(low=1, high=1000, integer=True)]
    # Race stress for our pass (arm=offload): its copy streams spin this many microseconds on the device before
    # each copy, so a missing stream wait turns into wrong losses instead of a lucky race (0: off).
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
        start, span = debug["memory_trace_step"], debug["memory_trace_steps"]
        if start is not None and not start + span <= steps:
            raise ConfigError("debug.memory_trace_steps", f"traces steps {start}..{start + span - 1}, past the run's "
                              f"last step {steps - 1} (debug.memory_trace_step={start})")
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
    strict: bool  # true: a multirun exits 1 when any point is not ok (false: only when one left no summary)
    # true: a multirun's later points reuse the profiles DeepCompile made for an earlier point of the same key, and
    # share inductor's and Triton's caches (harness/rank/profile_cache.py, README "On a GPU"). On by default since
    # tests/test_offload_gpu.py -k reuse passed on a GPU (a reused point plans as the same point run cold).
    reuse: bool
    # true (with reuse): DeepCompile's graph ids come from Dynamo's compile ids instead of the graphs' addresses, so
    # inductor's FX graph cache can hit across the points (harness/rank/graph_ids.py). On by default since
    # tests/test_offload_gpu.py -k stable passed on a GPU (the later point hit the cache, planned and computed as cold).
    stable_graph_ids: bool
    # true (with reuse): train.repeat leaves the profiles' key, so a point's later repeats reuse the DeepCompile
    # profiles its first repeat made (so the graphs those profiles schedule can hit inductor's cache). false (the
    # default): each repeat profiles afresh, so the spread of a point's repeats includes that of its profiles.
    reuse_repeats: bool
    # true: a point whose run dir holds an earlier attempt that ended ok, with the same config (the launcher's
    # timeouts and log level, sweep.strict and this key aside) and the same code, libraries and GPU model, is kept,
    # not run again (harness/driver/resume.py): a campaign longer than one call goes on with the same command and
    # hydra.sweep.dir. false: every point runs, an earlier attempt moved to attempts/N/.
    resume: bool
    # seconds since the epoch (null: none): a point that could not finish by then, going by the longest point this
    # sweep has recorded, is not started but recorded `skipped` (harness/driver/stop_at.py), so a call with a time
    # limit ends between points; one node only (nodes could judge the time left differently).
    stop_at: Annotated[Optional[float], POSITIVE]  # (its rule with launcher.nnodes: LauncherConfig.check)
