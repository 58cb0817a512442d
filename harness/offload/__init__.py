"""Our optimizer-state offload pass for DeepSpeed's DeepCompile (ZeRO-3): the seam the worker calls.

check_config(ds_config, offload_cfg)             refuse what cannot work, on any machine, before launch
install(engine, offload_cfg, budget_bytes, run_dir) register ops and passes; returns the compile schedule
counters()                                          cumulative op counters since process start
observe_step(record)                                a finished step's record, for the step model
plan_facts()                                        what the last plan moves, predicts and planned against
pass_seconds()                                      seconds our passes took so far (None before install)
"""
from __future__ import annotations

import logging
from harness.contract import schema
from harness.contract.errors import ConfigError
from harness.contract.units import GB

logger = logging.getLogger(__name__)

__all__ = ["check_config", "check_knobs", "install", "counters", "observe_step", "plan_facts", "pass_seconds",
           "PLANNING_STEP"]

# The step our pass plans at (phase 1's start): step 1 runs phase 0's compiled graphs once more, and its measured
# peaks correct the profile (schedule.py). Here, not in schedule.py, so that counting steps imports no DeepSpeed.
PLANNING_STEP = 2

_ON_HOST = ("cpu", "nvme")
_installed = None  # the OffloadPass of the engine install() set up in this process


def _device_of(section) -> str:
    return str((section or {}).get("device", "none")).lower()


def check_config(ds_config: dict, offload_cfg: dict) -> None:
    """Raise ConfigError(key, message) for a configuration the offload arm cannot run.

    Refused:
    - bad knob values (offload.mode, .empty_cache, .streams, .reload, .release, .launch, the budget keys,
      .budget_rule, .peak_cap_gb, .compose), and release at sites or launch after updates in blocking mode;
    - ZeRO stage other than 3 (the pass moves ZeRO-3's fp32 partitions and optimizer states, per sub-group);
    - ZeRO-Offload of the optimizer (`zero_optimization.offload_optimizer.device` cpu/nvme): the states
      already live on the host and the optimizer runs there;
    - parameter offload (`zero_optimization.offload_param.device` cpu/nvme, or `compile.offload_parameters`) and
      activation offload (`compile.offload_activation`): each plans against the whole memory budget on its own;
    - DeepSpeed's own `compile.offload_opt_states`: two passes would move the same states;
    - `compile.deepcompile` off: our passes run only inside DeepCompile.
    Gradient accumulation is accepted with every knob: the ops move the states once per optimizer step whatever
    the accumulation count (accumulation.py), in `mode=blocking` and under `release=ordered` alike.
    """
    check_knobs(offload_cfg)
    zero = ds_config.get("zero_optimization") or {}
    if zero.get("stage") != 3:
        raise ConfigError("zero_optimization.stage", f"the offload arm needs ZeRO stage 3, got {zero.get('stage')}")
    if _device_of(zero.get("offload_optimizer")) in _ON_HOST:
        raise ConfigError("zero_optimization.offload_optimizer",
                          "ZeRO-Offload keeps the optimizer states on the host already; use arm=zero_offload")
    if _device_of(zero.get("offload_param")) in _ON_HOST:
        raise ConfigError("zero_optimization.offload_param",
                          "parameter offload cannot be combined with the offload arm")
    compile_cfg = ds_config.get("compile") or {}
    if not compile_cfg.get("deepcompile"):
        raise ConfigError("compile.deepcompile", "the offload arm runs inside DeepCompile; it must be true")
    for key, why in (("offload_opt_states", "DeepSpeed's own pass would move the same states (arm=ds_offload)"),
                     ("offload_parameters", "parameter offload cannot be combined with the offload arm"),
                     ("offload_activation", "activation offload cannot be combined with the offload arm")):
        if compile_cfg.get(key):
            raise ConfigError(f"compile.{key}", why)


def check_knobs(offload_cfg: dict) -> None:
    """The offload group's own keys (its knobs and the budget); validate checks them for every arm, so a sweep
    over arms with a typo in them refuses every point, not only the offload arm's."""
    schema.check_group("offload", {"offload": offload_cfg})


def peak_cap_bytes(offload_cfg: dict) -> int | None:
    """The cap releases and asap reloads are placed under, in bytes (None: the budget)."""
    cap = offload_cfg.get("peak_cap_gb")
    return None if cap is None else int(cap * GB)


def uses_device_rule(offload_cfg: dict) -> bool:
    """No budget given and `auto_rule=device_limit`: our pass plans the least offload predicted to fit the device
    (emulated or real) less the allocator overhead measured on the run (plan.plan_for_device), instead of
    DeepSpeed's total x (1 - margin), which `auto_rule=margin` keeps."""
    return not schema.budget_given(offload_cfg) and offload_cfg["auto_rule"] == "device_limit"


def counters() -> dict:
    """Cumulative op counters (ops.Counters: launches, reloads, their bytes, empty_cache calls, cycles), cumulative
    device seconds (stalls.TIMES: compute waiting on our copies, copy streams busy; the copies the device is past,
    the rest at a later call), and the last step's allocator reading at our launch op (fwd_start_allocated_bytes)."""
    from harness.offload import ops  # torch stays out of the driver's config check
    if _installed is None:
        return ops.counters()
    runtime = _installed.runtime
    return {**ops.counters(), **runtime.mover.timer.collect(), **runtime.take_readings()}


def plan_facts() -> dict:
    """The last plan in this process, for worker.json ({} before a plan): the optimizer-state bytes it moves off
    the device, the step peak it predicts and the budget it planned against (the device rule's: the device less
    the overhead, not the budget the driver resolved)."""
    plan = _installed.last_plan if _installed is not None else None
    if plan is None:
        return {}
    return {"planned_offload_bytes": plan.offloaded_bytes, "predicted_peak_bytes": plan.predicted_peak_bytes,
            "budget_bytes": plan.budget_bytes}


def pass_seconds() -> float | None:
    """Seconds our passes (evict, snapshot, plan: our profile and plan) have taken in this process."""
    return _installed.pass_seconds if _installed is not None else None


def observe_step(record: dict) -> None:
    """A finished step's record (its segment peaks), for the pass's step model."""
    if _installed is not None:
        _installed.observe_step(record)


def reduce_buckets(engine) -> tuple[int, int]:
    """DeepCompile's gradient reduce buckets, (all, the largest one) in bytes: `zero_optimization.reduce_bucket_size`
    elements per gradient dtype, twice with `compile.double_buffer`, allocated in full at backward's first
    gradient."""
    sizes = [int(engine.zero_reduce_bucket_size()) * dtype.itemsize
             for dtype in {param.dtype for param in engine.module.parameters() if param.requires_grad}]
    copies = 2 if engine._config.compile_config.double_buffer else 1
    return sum(sizes) * copies, max(sizes, default=0)


def accumulation_recv_bytes(engine) -> int:
    """What gradient accumulation adds to backward: from the second micro-batch of an optimizer step on, DeepCompile
    reduce-scatters each bucket into a temporary receive buffer (its share per rank of one bucket, in the gradient
    dtype) and adds it to the gradient partitions. Those partitions persist across micro-batches at any accumulation
    (ZeRO-3 allocates them once; the forward start's reading holds them), so nothing else grows. 0 without it."""
    if engine.gradient_accumulation_steps() == 1:
        return 0
    largest_bucket = reduce_buckets(engine)[1]
    return -(-largest_bucket // engine.dp_world_size)


def install(engine, offload_cfg: dict, budget_bytes: int, run_dir: str, copy_delay_us: int = 0) -> list:
    """Register our ops and passes on a ZeRO-3 DeepSpeed engine; return the schedule for engine.compile().
    `copy_delay_us` (debug.copy_delay_us): a device-side spin before each copy, for race stress."""
    import torch
    from deepspeed.accelerator import get_accelerator
    from deepspeed.compile.util import get_deepcompile_handle

    from harness.offload import ops, schedule
    from harness.offload.accumulation import EngineMicroBatches
    from harness.offload.graph_pass import OffloadPass, PlanFiles
    from harness.offload.mover import CudaDevice, StateMover
    from harness.offload.runtime import EmptyCachePolicy, OffloadRuntime
    from harness.offload.states import SubGroupGate, discover_tasks

    check_knobs(offload_cfg)
    if not isinstance(budget_bytes, int) or budget_bytes < 0:
        raise ConfigError("offload.budget_gb", f"the budget must resolve to bytes >= 0, got {budget_bytes!r}")
    optimizer = engine.optimizer
    if not hasattr(optimizer, "fp32_partitioned_groups_flat") or not hasattr(optimizer, "_prepare_sub_group"):
        raise ConfigError("zero_optimization.stage", f"expected a ZeRO-3 optimizer, got {type(optimizer).__name__}")
    device = CudaDevice(torch.device("cuda", torch.cuda.current_device()))
    runtime = OffloadRuntime(
        StateMover(device, split_streams=offload_cfg["streams"] == "split", hold=offload_cfg["release"] == "ordered",
                   copy_delay_us=copy_delay_us),
        mode=offload_cfg["mode"],
        cache_policy=EmptyCachePolicy(offload_cfg["empty_cache"], device.empty_cache),
        is_profiling=lambda: get_deepcompile_handle().is_profiling(), micro_batches=EngineMicroBatches(engine),
        reclaim_at_sites=offload_cfg["release"] == "reclaimed",
        launch_after_update=offload_cfg["launch"] == "after_update")
    ops.register_ops()
    ops.bind_runtime(runtime)
    SubGroupGate(optimizer, runtime.before_sub_group_step, runtime.after_sub_group_step).install()
    runtime.gated = True
    if offload_cfg["evict_from"] == "start":
        moved = runtime.evict_from_start(lambda: discover_tasks(optimizer))
        logger.info(f"offload: {len(runtime.slots)} optimizer states ({moved / GB:.2f} GB) moved to the host "
                    "before step 0 (offload.evict_from=start)")
    compile_schedule = schedule.build_schedule(offload_cfg["compose"])
    offload_pass = OffloadPass(
        runtime, optimizer, None if uses_device_rule(offload_cfg) else budget_bytes, offload_cfg["reload"],
        PlanFiles(run_dir),
        device_total_bytes=int(get_accelerator().total_memory()),  # the emulated size, if one is set
        current_phase=lambda: schedule.phase_at(compile_schedule, engine.global_steps),
        release_policy=offload_cfg["release"], cap_bytes=peak_cap_bytes(offload_cfg),
        reduce_buckets=reduce_buckets(engine), budget_rule=offload_cfg["budget_rule"],
        accumulation_recv_bytes=accumulation_recv_bytes(engine),
        compose=offload_cfg["compose"], if_infeasible=offload_cfg["if_infeasible"])
    schedule.register_passes(engine, offload_pass)
    global _installed
    _installed = offload_pass
    return compile_schedule
