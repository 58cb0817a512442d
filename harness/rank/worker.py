"""One rank of one sweep point (started by torchrun; no Hydra): model + engine + the measured step loop.

    python -m torch.distributed.run ... -m harness.rank.worker RUN_DIR

Reads RUN_DIR/config.yaml (written by the driver). Global rank 0 appends one steps.jsonl row per
optimizer step and writes worker.json; any rank that fails writes error.rank<R>.json for the driver.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import psutil
import torch
import torch.distributed as dist

from harness import arms
from harness.rank import emulated_device, machine, models, profile_cache
from harness.contract import logs, protocol, runfiles, schema
from harness.contract.budget import resolve_budget_bytes
from harness.contract.errors import refusal_in
from harness.contract.schema.groups import DebugConfig, EnvConfig, OffloadConfig
from harness.rank.diagnostics import StepDiagnostics
from harness.rank.garbage import GcClock, GcPolicy
from harness.contract import steps
from harness.contract.steps import phase_of
from harness.rank.host_memory import HostMemoryMonitor
from harness.rank.monitor import ArmCounters, MemoryMonitor, aggregate_over_ranks, physical_total_bytes
from harness.rank.wall_split import WallSplit
from harness.contract.runfiles import StepWriter, write_json
from harness.contract.units import GB

logger = logging.getLogger("harness.rank.worker")  # by name: torchrun runs this module as __main__
progress = logging.getLogger(logs.PROGRESS)

OOM_EXIT_CODE = 3
SHARED_DEVICE_WARN_BYTES = 2 * GB  # a CUDA context takes ~0.5 GB; more than this means a neighbour


def synchronize(device: torch.device, what: str = "device") -> None:
    """Wait for every stream of the device, or (`what="compute"`, train.step_sync) for the compute stream only."""
    if device.type != "cuda":
        return
    if what == "compute":
        torch.cuda.current_stream(device).synchronize()
    else:
        torch.cuda.synchronize(device)


def init_distributed(cuda: bool) -> torch.device:
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    if not cuda:
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


@dataclass
class Position:
    """Where a rank is: before step 0 (building the model and engine) or inside an optimizer step."""
    step: int | None = None
    phase: int | None = None

    @property
    def stage(self) -> str:
        return "build" if self.step is None else "step"


def cap_reserved_memory(cap_gb: float | None, monitor: MemoryMonitor) -> None:
    """env.reserved_cap_gb: the caching allocator's ceiling, set when the final phase begins: earlier phases hold
    every optimizer state resident (offload arms evict them only then). A measurement tool inside whatever device
    (real or emulated) the run has."""
    if cap_gb is None:
        return
    if not monitor.cuda:
        logger.warning("worker: env.reserved_cap_gb needs CUDA (it caps the caching allocator); ignored")
        return
    emulated_device.set_allocator_ceiling(int(cap_gb * GB), physical_total_bytes(monitor.device), monitor.device)


def resolve_budget(offload: OffloadConfig, monitor: MemoryMonitor, device: torch.device) -> int | None:
    """The offload budget in bytes, resolved on rank 0 (which knows the device) and sent to all ranks."""
    total = monitor.device_total_bytes()
    if offload.budget_gb is None and total is None:
        return None
    budget = resolve_budget_bytes(offload.budget_gb, offload.budget_fraction, offload.margin, total or 0)
    value = torch.tensor([budget], dtype=torch.int64, device=device)
    dist.broadcast(value, src=0)
    return int(value.item())


def gather_from_ranks(value: Any) -> list[Any]:
    """Every rank's value, in rank order."""
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def gpu_name(device: torch.device) -> str | None:
    """The device's model name (None on a CPU run)."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def gpu_uuid(device: torch.device) -> str | None:
    """The device's UUID as NVML names it (None on a CPU run)."""
    return f"GPU-{torch.cuda.get_device_properties(device).uuid}" if device.type == "cuda" else None


class MachineWatch:
    """Every rank's machine reading (harness/rank/machine.py) at the start and at the end of the measured steps,
    gathered in rank order with the ranks' pids (a collective: every rank reads at the same steps)."""

    def __init__(self, device: torch.device, counts: protocol.StepCounts):
        self.uuid = gpu_uuid(device)
        self.first_measured = counts.first_measured
        self.measures = counts.measured > 0
        self.readings: dict[str, list] = {}

    def before(self, step: int) -> None:
        if self.measures and step == self.first_measured:
            self.readings["start"] = gather_from_ranks(machine.reading(self.uuid))

    def facts(self) -> dict[str, Any]:
        """For worker.json, once the last step is done: the readings and the pids they must not count as others."""
        if not self.measures:
            return {"machine": None}
        self.readings["end"] = gather_from_ranks(machine.reading(self.uuid))
        return {"machine": {**self.readings, "pids": gather_from_ranks(os.getpid())}}


def accelerator_total_bytes() -> int:
    """The device size DeepSpeed's accelerator reports to DeepCompile's passes (the emulated one if set)."""
    from deepspeed.accelerator import get_accelerator

    return int(get_accelerator().total_memory())


def _fault_here(debug: DebugConfig, step: int, rank: int) -> bool:
    """Whether debug.fault (if any) targets this step on this rank."""
    return debug.fault is not None and step == debug.fault_step and rank == debug.fault_rank


def inject_fault(debug: DebugConfig, step: int, rank: int) -> None:
    """debug.fault: make a failure happen for real at a chosen step, to test how it is recorded."""
    if not _fault_here(debug, step, rank):
        return
    if debug.fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if debug.fault == "oom":
        raise torch.OutOfMemoryError("CUDA out of memory (injected by debug.fault=oom)")
    if debug.fault == "hang":
        while True:
            time.sleep(60)


def slow_down(debug: DebugConfig, step: int, rank: int) -> None:
    """debug.fault=slow: this rank sleeps inside the timed step, so only a max over ranks shows it."""
    if debug.fault == "slow" and _fault_here(debug, step, rank):
        time.sleep(debug.fault_sleep_s)


@dataclass
class Built:
    """What a rank built before step 0, handed from `build` to `step_loop`."""
    device: torch.device
    rank: int
    world: int
    monitor: MemoryMonitor
    host: HostMemoryMonitor
    engine: Any
    starts: list[int]  # the step each phase starts at
    facts: dict[str, Any]  # worker.json's facts of the start
    cache: profile_cache.ProfileCache | None  # the sweep's DeepCompile profiles (compiled arms only)


def run(config: schema.Config, run_dir: Path, position: Position) -> None:
    split = WallSplit()
    split.mark("imports_s")
    built = build(config, run_dir, position, split)
    if built.rank == 0:
        write_json(run_dir / runfiles.WORKER, built.facts)
    with GcClock() as gc_clock, GcPolicy(config.train.gc) as gc_policy:
        machine_facts = step_loop(config, run_dir, position, built, split, gc_clock, gc_policy)
    if built.rank == 0:
        cache_facts = built.cache.facts_for_worker() if built.cache else None
        write_json(run_dir / runfiles.WORKER, {**built.facts, **config.arm.plan_facts(), **machine_facts,
                                               "profile_cache": cache_facts, "wall_split": split.facts()})
    dist.barrier()


def build(config: schema.Config, run_dir: Path, position: Position, split: WallSplit) -> Built:
    """Everything before step 0, each part timed into `split`: the process group, the (emulated) device, the model
    under zero.Init, the engine and the arm's compile set-up; and the facts of the start for worker.json."""
    import deepspeed

    cuda = torch.cuda.is_available()
    device = init_distributed(cuda)
    split.mark("process_group_s")
    rank, world = dist.get_rank(), dist.get_world_size()
    logs.setup(config.launcher.log_level, rank)
    # Before anything is allocated: the whole run sees the emulated device, phase 0 included.
    monitor = MemoryMonitor(device, emulated_device.apply(config.env, device, physical_total_bytes(device)))
    outside = monitor.used_outside_torch_bytes()
    if outside is not None and outside > SHARED_DEVICE_WARN_BYTES:
        logger.warning(f"worker: rank {rank}: {outside / GB:.1f} GB of device memory in use outside this process "
                       "before the model exists: another job shares the GPU; timings and DeepCompile's memory "
                       "profile (which adds that memory to every node) are skewed")
    arm = config.arm
    budget = resolve_budget(config.offload, monitor, device) if arm.offloads_opt_states else None

    ds_config = arm.deepspeed_config(config, cuda)
    # transformers builds from the model section as written: a key it leaves out stays transformers' default.
    make_model = models.model_factory(config.written["model"])
    torch.manual_seed(config.train.seed)
    with deepspeed.zero.Init(config_dict_or_path=ds_config):
        model = make_model()
    split.mark("model_s")
    n_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    cache = None
    if isinstance(arm, arms.CompiledArm):  # DeepCompile profiles: timed, and reused across a sweep's points
        cache = profile_cache.open_for(config, run_dir, rank, gpu_name(device))
        split.profiling_seconds = profile_cache.install(cache, lambda: position.phase)
    split.pass_seconds = arm.pass_seconds
    starts = arm.compile(config, engine, budget, str(run_dir))
    split.mark("engine_s")

    host = HostMemoryMonitor(monitor.cuda)
    flops_per_token = models.flops_per_token(config.model.config, n_params, config.train.seq_len)
    facts = {"world_size": world, "hostnames": sorted(set(gather_from_ranks(socket.gethostname()))),
             "budget_bytes": budget, "device_total_bytes": monitor.device_total_bytes(),
             "physical_device_total_bytes": physical_total_bytes(device),
             "device_memory_bytes": monitor.emulated_bytes,
             "accelerator_total_bytes_per_rank": gather_from_ranks(accelerator_total_bytes()),
             "phase_starts": starts, "n_params": n_params,
             "flops_per_token": flops_per_token, "planned_offload_bytes": None, "predicted_peak_bytes": None,
             "used_outside_torch_bytes_at_start": outside, "startup_s": seconds_since_process_start(), **host.at_start}
    return Built(device, rank, world, monitor, host, engine, starts, facts, cache)


def step_loop(config: schema.Config, run_dir: Path, position: Position, built: Built, split: WallSplit,
              gc_clock: GcClock, gc_policy: GcPolicy) -> dict[str, Any]:
    """Every optimizer step of the run (the protocol's counts), one steps.jsonl row each from rank 0; returns the
    machine readings around the measured steps (a collective, so every rank calls it). `gc_clock` times the garbage
    collector inside each step, `gc_policy` (train.gc) runs between steps."""
    train, arm, device, monitor = config.train, config.arm, built.device, built.monitor
    writer = StepWriter(run_dir) if built.rank == 0 else None
    generator = torch.Generator().manual_seed(train.seed * 1000 + built.rank)
    counters = ArmCounters(arm.offload_counter_reader())
    counts = protocol.step_counts(train, built.starts)
    watch = MachineWatch(device, counts)
    tokens = train.micro_batch * train.seq_len * train.grad_accum * built.world
    vocab = config.model.config.vocab_size
    diagnostics = StepDiagnostics(config.debug, built.rank, monitor.cuda)
    for step in range(counts.total):
        phase, phase_step = phase_of(step, built.starts)
        position.step, position.phase = step, phase
        inject_fault(config.debug, step, built.rank)
        if step == counts.final_start:
            cap_reserved_memory(config.env.reserved_cap_gb, monitor)
        monitor.reset_peaks()
        gc_policy.before_step()  # between_steps: a full collection here, before the opening sync
        synchronize(device, train.step_sync)
        watch.before(step)
        diagnostics.before(step, device)
        split.before_step(phase_step)
        gc_clock.reset()
        start = time.perf_counter()
        loss_sum = torch.zeros((), device=device)
        for _ in range(train.grad_accum):
            ids = models.synthetic_batch(generator, train.micro_batch, train.seq_len, vocab, device)
            loss = built.engine(input_ids=ids, labels=ids).loss
            built.engine.backward(loss)
            monitor.end_segment("fwd_bwd")
            built.engine.step()
            monitor.end_segment("opt_step")
            loss_sum += loss.detach().float()
        slow_down(config.debug, step, built.rank)
        queued = time.perf_counter()
        synchronize(device, train.step_sync)  # the step's end: all its device work, or its compute stream's
        end = time.perf_counter()
        step_time = end - start
        gc_step = gc_clock.step_stats()
        split.after_step(phase, phase_step, step_time)
        diagnostics.after(step, device, run_dir)
        record = steps.record({"step": step, "phase": phase, "phase_step": phase_step, "step_time_s": step_time,
                               "end_sync_s": end - queued if monitor.cuda else None,
                               "loss": loss_sum.item() / train.grad_accum, **monitor.step_stats(),
                               **built.host.step_stats(), **gc_step, **counters.step_values(),
                               "traced": diagnostics.traces(step)})
        record = aggregate_over_ranks(record, device)
        arm.observe_step(record)
        record.update(throughput(tokens, record["step_time_s"], built.facts["flops_per_token"], built.world))
        if writer is not None:
            writer.write(record)
            progress.info(progress_line(record, counts.total))
    facts = watch.facts()
    if writer is not None:
        writer.close()
    logger.info(f"worker: rank {built.rank} finished {counts.total} steps")
    return facts


def seconds_since_process_start() -> float:
    """How long this rank took to reach its first step (imports, process group, model, engine): the part of a
    point's wall time that is neither a compile nor a measured step."""
    return round(time.time() - psutil.Process().create_time(), 2)


def throughput(tokens: int, step_time_s: float, flops_per_token: float, world: int) -> dict[str, float]:
    """The step's tokens (every rank's), tokens per second and TFLOPs per GPU, from its time combined over ranks."""
    return {"tokens": tokens, "tokens_per_s": tokens / step_time_s,
            "tflops_per_gpu": flops_per_token * tokens / step_time_s / world / 1e12}


def exit_now(code: int) -> NoReturn:
    """Leave without the interpreter's teardown: everything is written, and tearing down DeepSpeed's compiled
    engine (DeepSpeed's own offload pass most of all) has been seen to hang for minutes after the last step."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def progress_line(record: dict, steps: int) -> str:
    """The console's one line per step (the driver echoes lines that start with 'step ')."""
    mem = ""
    if record.get("peak_reserved_bytes") is not None:
        mem = f" | mem {record['peak_allocated_bytes'] / GB:.1f}/{record['peak_reserved_bytes'] / GB:.1f} GB"
    return (f"step {record['step'] + 1}/{steps} phase {record['phase']} | {record['step_time_s']:.3f} s"
            f" | loss {record['loss']:.4f} | {record['tokens_per_s']:,.0f} tok/s{mem}")


def write_error(run_dir: Path, kind: str, error: BaseException, details: dict | None = None) -> None:
    rank = int(os.environ.get("RANK", "0"))
    write_json(run_dir / runfiles.rank_error(rank),
               {"kind": kind, "rank": rank, "message": f"{type(error).__name__}: {error}"[:2000], **(details or {})})


def oom_details(error: BaseException, position: Position, env: EnvConfig) -> dict:
    """Where a rank ran out and by how much: the failing step and phase (or the build), the allocation asked for,
    and what the allocator held against its limit (the emulated size, else the real device) at that moment."""
    details = {"step": position.step, "phase": position.phase, "stage": position.stage,
               "requested_bytes": emulated_device.requested_bytes(str(error)), "limit_bytes": None,
               "reserved_bytes": None, "allocated_bytes": None, "free_bytes": None}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        device = torch.cuda.current_device()
        emulated = emulated_device.size_bytes(env.device_memory_gb)
        limit = emulated or torch.cuda.get_device_properties(device).total_memory
        reserved = torch.cuda.memory_reserved(device)
        details.update(limit_bytes=limit, reserved_bytes=reserved, allocated_bytes=torch.cuda.memory_allocated(device),
                       free_bytes=max(0, limit - reserved))
    return details


def main(argv: list[str] | None = None) -> None:
    run_dir = Path((argv or sys.argv[1:])[0])
    written = runfiles.read_config(run_dir)  # the driver validated it and settled its step counts
    arms.admit_handed(written["arm"])  # an arm class outside the registry, which the driver admitted for this point
    config = schema.typed(written, arms.from_config(written["arm"]))
    position = Position()
    try:
        run(config, run_dir, position)
    except torch.OutOfMemoryError as error:
        write_error(run_dir, "oom", error, oom_details(error, position, config.env))
        traceback.print_exc()
        sys.exit(OOM_EXIT_CODE)
    except Exception as error:
        refused = refusal_in(error)  # offload.if_infeasible=refuse: recorded config_error, not a crash
        write_error(run_dir, "config_error" if refused else "error", refused or error)
        raise
    exit_now(0)


if __name__ == "__main__":
    main()
