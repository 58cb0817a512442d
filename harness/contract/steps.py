"""Step records, phases, per-phase statistics, rank aggregation and the device memory monitor."""
from __future__ import annotations

import statistics
from typing import Any, Iterable, Sequence

import torch

from harness.contract import protocol
from harness.offload.stalls import TIMES as OFFLOAD_TIMES
from harness.contract.stats import median_interval

# An offload arm's step-record fields: counts and device seconds (per-step deltas of cumulative counters), and
# our pass's allocator reading at the forward's start (before its launch op). `offload_cycles`: how many times
# per optimizer step the states went out (and back): 1 for our pass whatever the gradient accumulation, one per
# micro-batch for DeepSpeed's pass.
OFFLOAD_COUNTS = ("offload_launches", "reloads", "offload_bytes", "reload_bytes", "empty_cache_calls",
                  "offload_cycles")
OFFLOAD_COUNTERS = OFFLOAD_COUNTS + OFFLOAD_TIMES
OFFLOAD_GAUGES = ("fwd_start_allocated_bytes",)
# The step's segments the monitor reads peaks for, in order: forward + backward (to engine.backward's return),
# then the optimizer step. Every arm's step record has `<segment>_peak_allocated_bytes`.
SEGMENTS = ("fwd_bwd", "opt_step")
SEGMENT_PEAKS = tuple(f"{segment}_peak_allocated_bytes" for segment in SEGMENTS)
# Step-record fields that are aggregated across ranks, and how.
RANK_MAX_FIELDS = ("step_time_s", "peak_allocated_bytes", "peak_reserved_bytes", "alloc_retries", "ooms",
                   *SEGMENT_PEAKS, *OFFLOAD_TIMES, *OFFLOAD_GAUGES)
RANK_MIN_FIELDS = OFFLOAD_COUNTS


def phase_of(step: int, phase_starts: Sequence[int]) -> tuple[int, int]:
    """(phase index, step within the phase) of an optimizer step, given the steps where phases begin."""
    phase = max(i for i, start in enumerate(phase_starts) if start <= step)
    return phase, step - phase_starts[phase]


def quartiles(values: Sequence[float]) -> dict[str, float | None]:
    """Median and inclusive p25/p75 (numpy's default linear interpolation); nulls for no values."""
    if not values:
        return {"median": None, "p25": None, "p75": None}
    if len(values) == 1:
        return {"median": values[0], "p25": values[0], "p75": values[0]}
    p25, _, p75 = statistics.quantiles(values, n=4, method="inclusive")
    return {"median": statistics.median(values), "p25": p25, "p75": p75}


def _present(rows: Iterable[dict], key: str) -> list:
    return [r[key] for r in rows if r.get(key) is not None]


def time_stats(values: Sequence[float]) -> dict[str, float | None]:
    """Median, p25/p75 and the median's 95% bootstrap interval (ci95_low/high; nulls for fewer than two values)."""
    low, high = median_interval(values) or (None, None)
    return {**quartiles(values), "ci95_low": low, "ci95_high": high}


def phase_stats(phase: int, rows: list[dict], warmup: int = 0) -> dict[str, Any]:
    """Statistics of one phase; its first step compiles (or warms up) and is reported apart, and the `warmup` steps
    after it and any step slowed by a debug trace (`traced`) are left out of the statistics."""
    first = [r for r in rows if r["phase_step"] == 0]
    measured = [r for r in rows if protocol.is_measured(r, warmup)]
    maxima = {k: (max(v) if (v := _present(rows, k)) else None)
              for k in ("peak_allocated_bytes", "peak_reserved_bytes")}
    sums = {k: (sum(v) if (v := _present(rows, k)) else None) for k in ("alloc_retries", "ooms")}
    return {
        "phase": phase,
        "first_step": min(r["step"] for r in rows),
        "last_step": max(r["step"] for r in rows),
        "n": len(measured),
        "measured_steps": [r["step"] for r in measured],
        "compile_time_s": first[0]["step_time_s"] if first else None,
        "step_time_s": time_stats(_present(measured, "step_time_s")),
        "tokens_per_s": quartiles(_present(measured, "tokens_per_s")),
        "tflops_per_gpu": quartiles(_present(measured, "tflops_per_gpu")),
        # steady_max: steps after the phase's first, whose peak can be the compiler's (DeepCompile's profiling)
        "peak_allocated_bytes": {"max": maxima["peak_allocated_bytes"],
                                 "steady_max": max(_present(measured, "peak_allocated_bytes"), default=None)},
        "peak_reserved_bytes": {"max": maxima["peak_reserved_bytes"]},
        "alloc_retries": {"sum": sums["alloc_retries"]},
        "ooms": {"sum": sums["ooms"]},
        **{k: {"median": quartiles(_present(measured, k))["median"]}
           for k in ("offload_bytes", "reload_bytes", "offload_cycles", *OFFLOAD_TIMES)},
        **{k: {"steady_max": max(_present(measured, k), default=None)} for k in SEGMENT_PEAKS},
    }


def summarize_phases(rows: list[dict], warmup: int = 0) -> list[dict[str, Any]]:
    """Per-phase statistics of a run's step rows, in phase order, `warmup` steps after each compile step left out."""
    phases = sorted({r["phase"] for r in rows})
    return [phase_stats(p, [r for r in rows if r["phase"] == p], warmup) for p in phases]


def physical_total_bytes(device: torch.device) -> int | None:
    """The real device's memory (None on CPU)."""
    return torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None


class MemoryMonitor:
    """Per-step device memory peaks, per segment of the step (SEGMENTS), and allocator events (None everywhere on
    a CPU run). `emulated_bytes` is the emulated device size (env.device_memory_gb), which every memory-aware
    decision sees instead of the real one."""

    def __init__(self, device: torch.device, emulated_bytes: int | None = None):
        self.cuda = device.type == "cuda"
        self.device = device
        self.emulated_bytes = emulated_bytes
        self._retries = self._ooms = 0
        self._segments: dict[str, tuple[int, int]] = {}  # this step's closed segments: (allocated, reserved) peaks
        if self.cuda:
            stats = torch.cuda.memory_stats(device)
            self._retries, self._ooms = stats.get("num_alloc_retries", 0), stats.get("num_ooms", 0)

    def reset_peaks(self) -> None:
        """A step starts: its peaks count from here."""
        self._segments = {}
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def end_segment(self, segment: str) -> None:
        """Close a segment of the step (SEGMENTS; with gradient accumulation each micro-batch closes each once, and
        the segment keeps its highest peaks) and start counting the next one's peaks from here."""
        if not self.cuda:
            return
        allocated, reserved = self._segments.get(segment, (0, 0))
        peak_allocated, peak_reserved = _peaks(torch.cuda.memory_stats(self.device))
        self._segments[segment] = (max(allocated, peak_allocated), max(reserved, peak_reserved))
        torch.cuda.reset_peak_memory_stats(self.device)

    def device_total_bytes(self) -> int | None:
        """The device size decisions are made against: the emulated one, else the real one."""
        return self.emulated_bytes if self.emulated_bytes is not None else physical_total_bytes(self.device)

    def used_outside_torch_bytes(self) -> int | None:
        """Device memory in use that this process's allocator does not hold: the CUDA context, other processes.
        DeepCompile adds it to every profiled peak, so another job on the same GPU skews the offload plans."""
        if not self.cuda:
            return None
        free, total = torch.cuda.mem_get_info(self.device)
        return total - free - torch.cuda.memory_reserved(self.device)

    def step_stats(self) -> dict[str, int | None]:
        """The step's peaks (over its segments and whatever ran after the last one), each segment's allocated peak,
        and allocator retries/OOMs since the last call."""
        if not self.cuda:
            return {"peak_allocated_bytes": None, "peak_reserved_bytes": None, **dict.fromkeys(SEGMENT_PEAKS),
                    "alloc_retries": None, "ooms": None}
        stats = torch.cuda.memory_stats(self.device)
        retries, ooms = stats.get("num_alloc_retries", 0), stats.get("num_ooms", 0)
        peaks = [*self._segments.values(), _peaks(stats)]
        out = {"peak_allocated_bytes": max(allocated for allocated, _ in peaks),
               "peak_reserved_bytes": max(reserved for _, reserved in peaks),
               **{f"{segment}_peak_allocated_bytes": self._segments[segment][0] if segment in self._segments else None
                  for segment in SEGMENTS},
               "alloc_retries": retries - self._retries, "ooms": ooms - self._ooms}
        self._retries, self._ooms = retries, ooms
        return out


def _peaks(stats: dict) -> tuple[int, int]:
    """(allocated, reserved) peaks since torch's last peak reset, from `torch.cuda.memory_stats`."""
    return stats.get("allocated_bytes.all.peak", 0), stats.get("reserved_bytes.all.peak", 0)


def aggregate_over_ranks(record: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Max over ranks for time and memory, min for offload counters (> 0 proves every rank ran them),
    mean for the loss. A no-op for world size 1."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return record
    out = dict(record)
    for fields, op in ((RANK_MAX_FIELDS, dist.ReduceOp.MAX), (RANK_MIN_FIELDS, dist.ReduceOp.MIN)):
        present = [k for k in fields if record.get(k) is not None]
        if not present:
            continue
        values = torch.tensor([float(record[k]) for k in present], dtype=torch.float64, device=device)
        dist.all_reduce(values, op=op)
        for k, v in zip(present, values.tolist()):
            out[k] = v if isinstance(record[k], float) else int(v)
    loss = torch.tensor([record["loss"]], dtype=torch.float64, device=device)
    dist.all_reduce(loss, op=dist.ReduceOp.SUM)
    out["loss"] = loss.item() / dist.get_world_size()
    return out
