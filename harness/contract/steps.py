"""The step record: every field of a steps.jsonl row declared once, and the phases of a run with their statistics.

A `StepField` says what a field is (its unit), who measures it (the step loop, the memory monitor, the arm's
counters), how the ranks combine it, which statistics of it summary.json keeps per phase and which report column
shows it. The rank builds its record (`record`) and combines it over ranks by these declarations, the driver's
summary.json and the W&B mirror hold the phase statistics they name, and the report's tables take their columns
from them; a new field is one line in FIELDS (and the code on the rank that measures it).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from harness.contract import protocol
from harness.contract.stats import median_interval
from harness.contract.units import GB


@dataclass(frozen=True)
class Column:
    """A report column of a field: its heading, which of its phase statistics it shows, and in which table."""
    title: str
    stat: str
    table: str  # "memory": per design point and phase; "transfers": the final phase of points that timed copies


@dataclass(frozen=True)
class StepField:
    """One field of a steps.jsonl row, declared once; see the module docstring."""
    name: str
    unit: str  # "s", "bytes", "count", "tokens", "tokens/s", "TFLOP/s", "loss", "flag", "index"
    source: str  # who measures it: "loop" (the step loop), "monitor" (device memory), "host" (host memory,
    #              harness/rank/host_memory.py), "gc" (Python's garbage collector, harness/rank/garbage.py),
    #              "arm" (the arm's counters)
    ranks: str | None = None  # how ranks combine it: "max", "min" (> 0 proves every rank did it), "mean"; None:
    #                           the same on every rank, or worked out on rank 0 after combining (tokens/s)
    phase: tuple[str, ...] = ()  # the statistics summary.json keeps of it per phase (PHASE_STATISTICS)
    cumulative: bool = False  # the arm reports a running total: the record holds this step's delta
    columns: tuple[Column, ...] = ()

    @property
    def scale(self) -> float:
        """What a report cell divides by: bytes are shown in GB."""
        return GB if self.unit == "bytes" else 1


def _present(rows: Iterable[Mapping], key: str) -> list:
    return [row[key] for row in rows if row.get(key) is not None]


def quartiles(values: Sequence[float]) -> dict[str, float | None]:
    """Median and inclusive p25/p75 (numpy's default linear interpolation); nulls for no values."""
    if not values:
        return {"median": None, "p25": None, "p75": None}
    if len(values) == 1:
        return {"median": values[0], "p25": values[0], "p75": values[0]}
    p25, _, p75 = statistics.quantiles(values, n=4, method="inclusive")
    return {"median": statistics.median(values), "p25": p25, "p75": p75}


def time_stats(values: Sequence[float]) -> dict[str, float | None]:
    """Median, p25/p75 and the median's 95% bootstrap interval (ci95_low/high; nulls for fewer than two values)."""
    low, high = median_interval(values) or (None, None)
    return {**quartiles(values), "ci95_low": low, "ci95_high": high}


# A phase statistic: (every step of the phase, its measured steps) -> its entries. Memory peaks, retries and OOMs
# count every step (the compile step's too); times, rates and bytes moved count the measured steps only.
PHASE_STATISTICS: dict[str, Callable[[list[float], list[float]], dict[str, Any]]] = {
    "interval": lambda every, measured: time_stats(measured),
    "quartiles": lambda every, measured: quartiles(measured),
    "median": lambda every, measured: {"median": quartiles(measured)["median"]},
    "max": lambda every, measured: {"max": max(every, default=None)},
    # the phase's first step can hold the compiler's peak (DeepCompile's profiling): steady_max leaves it out
    "steady_max": lambda every, measured: {"steady_max": max(measured, default=None)},
    "sum": lambda every, measured: {"sum": sum(every) if every else None},
    "measured_sum": lambda every, measured: {"measured_sum": sum(measured) if measured else None},
}

FIELDS: tuple[StepField, ...] = (
    StepField("step", "index", "loop"),
    StepField("phase", "index", "loop"),
    StepField("phase_step", "index", "loop"),
    StepField("step_time_s", "s", "loop", ranks="max", phase=("interval",)),
    # the host's wait in the step's closing synchronize (train.step_sync), part of step_time_s: near 0, the host,
    # not the device, set the step's pace (it queued the last work just before the device finished). Null on CPU.
    StepField("end_sync_s", "s", "loop", ranks="max", phase=("median",)),
    StepField("loss", "loss", "loop", ranks="mean"),  # the mean over the step's micro-batches, then over ranks
    StepField("tokens", "tokens", "loop"),
    StepField("tokens_per_s", "tokens/s", "loop", phase=("quartiles",)),
    StepField("tflops_per_gpu", "TFLOP/s", "loop", phase=("quartiles",)),
    StepField("traced", "flag", "loop"),  # a debug recorder slowed this step: left out of the statistics
    StepField("peak_allocated_bytes", "bytes", "monitor", ranks="max", phase=("max", "steady_max"),
              columns=(Column("peak allocated (GB)", "max", "memory"),)),
    StepField("peak_reserved_bytes", "bytes", "monitor", ranks="max", phase=("max",),
              columns=(Column("peak reserved (GB)", "max", "memory"),)),
    # the step's segments: forward + backward (to engine.backward's return), then the optimizer step
    StepField("fwd_bwd_peak_allocated_bytes", "bytes", "monitor", ranks="max", phase=("steady_max",)),
    StepField("opt_step_peak_allocated_bytes", "bytes", "monitor", ranks="max", phase=("steady_max",)),
    # an offload arm's counters; `offload_cycles`: how many times per optimizer step the states went out (and
    # back), 1 for our pass whatever the gradient accumulation, one per micro-batch for DeepSpeed's pass
    StepField("offload_launches", "count", "arm", ranks="min", cumulative=True),
    StepField("reloads", "count", "arm", ranks="min", cumulative=True),
    StepField("offload_bytes", "bytes", "arm", ranks="min", phase=("median",), cumulative=True,
              columns=(Column("offloaded/step (GB)", "median", "memory"),
                       Column("offloaded (GB)", "median", "transfers"))),
    StepField("reload_bytes", "bytes", "arm", ranks="min", phase=("median",), cumulative=True,
              columns=(Column("reloaded/step (GB)", "median", "memory"),)),
    StepField("empty_cache_calls", "count", "arm", ranks="min", cumulative=True),
    StepField("offload_cycles", "count", "arm", ranks="min", phase=("median",), cumulative=True),
    StepField("alloc_retries", "count", "monitor", ranks="max", phase=("sum",),
              columns=(Column("alloc retries", "sum", "memory"),)),
    StepField("ooms", "count", "monitor", ranks="max", phase=("sum",)),
    # the host side of the trade, at the step's end: the rank's resident set, what torch's pinned-host allocator
    # holds (each buffer rounded up to a power of two) and the seconds this step spent pinning
    StepField("host_rss_bytes", "bytes", "host", ranks="max", phase=("max",),
              columns=(Column("host RSS (GB)", "max", "memory"),)),
    StepField("pinned_host_bytes", "bytes", "host", ranks="max", phase=("max",),
              columns=(Column("pinned host (GB)", "max", "memory"),)),
    StepField("pin_time_s", "s", "host", ranks="max", phase=("sum",)),
    # Python's garbage collector inside the step's time: its seconds and collections (train.gc)
    StepField("gc_s", "s", "gc", ranks="max", phase=("measured_sum",)),
    StepField("gc_collections", "count", "gc", ranks="max", phase=("measured_sum",)),
    # our pass's device seconds: each copy stream's busy time, and how long compute stood waiting for the copies
    StepField("copy_d2h_busy_s", "s", "arm", ranks="max", phase=("median",), cumulative=True,
              columns=(Column("D2H busy (s)", "median", "transfers"),)),
    StepField("copy_h2d_busy_s", "s", "arm", ranks="max", phase=("median",), cumulative=True,
              columns=(Column("H2D busy (s)", "median", "transfers"),)),
    StepField("offload_stall_s", "s", "arm", ranks="max", phase=("median",), cumulative=True,
              columns=(Column("compute waits (s)", "median", "transfers"),)),
    # release=reclaimed: host seconds its sites waited for copies out (the device meanwhile runs the queued forward)
    StepField("reclaim_wait_s", "s", "arm", ranks="max", phase=("median",), cumulative=True),
    # our pass's allocator reading at its launch op: the forward's start, before any offload
    StepField("fwd_start_allocated_bytes", "bytes", "arm", ranks="max"),
)


def fields(source: str | None = None) -> tuple[StepField, ...]:
    """The declared fields (read at call time, so a test may declare one more), of one source or all."""
    return tuple(field for field in FIELDS if source is None or field.source == source)


def record(values: Mapping[str, Any]) -> dict[str, Any]:
    """A step's record: every declared field, null where nothing measured it (a CPU run's memory, an arm without
    counters); a value no field declares is not recorded."""
    return {field.name: values.get(field.name) for field in fields()}


def columns(table: str) -> list[tuple[StepField, Column]]:
    """A report table's columns, in declaration order."""
    return [(field, column) for field in fields() for column in field.columns if column.table == table]


# --- phases ----------------------------------------------------------------------------------------------

def phase_of(step: int, phase_starts: Sequence[int]) -> tuple[int, int]:
    """(phase index, step within the phase) of an optimizer step, given the steps where phases begin."""
    phase = max(i for i, start in enumerate(phase_starts) if start <= step)
    return phase, step - phase_starts[phase]


def phase_stats(phase: int, rows: list[dict], warmup: int = 0) -> dict[str, Any]:
    """Statistics of one phase; its first step compiles (or warms up) and is reported apart, and the `warmup` steps
    after it and any step slowed by a debug trace (`traced`) are left out of the measured steps."""
    first = [row for row in rows if row["phase_step"] == 0]
    measured = [row for row in rows if protocol.is_measured(row, warmup)]
    stats: dict[str, Any] = {
        "phase": phase,
        "first_step": min(row["step"] for row in rows),
        "last_step": max(row["step"] for row in rows),
        "n": len(measured),
        "measured_steps": [row["step"] for row in measured],
        "compile_time_s": first[0]["step_time_s"] if first else None,
    }
    for field in fields():
        if field.phase:
            every, steady = _present(rows, field.name), _present(measured, field.name)
            stats[field.name] = {key: value for statistic in field.phase
                                 for key, value in PHASE_STATISTICS[statistic](every, steady).items()}
    return stats


def summarize_phases(rows: list[dict], warmup: int = 0) -> list[dict[str, Any]]:
    """Per-phase statistics of a run's step rows, in phase order, `warmup` steps after each compile step left out."""
    phases = sorted({row["phase"] for row in rows})
    return [phase_stats(phase, [row for row in rows if row["phase"] == phase], warmup) for phase in phases]


def steady_peak_bytes(rows: Iterable[Mapping[str, Any]]) -> int | None:
    """The peak allocated bytes of the last phase's steps after its compile step (whose peak can be the compiler's
    profiling): what a plan's predicted peak is set against. None where no such step recorded one."""
    rows = list(rows)
    if not rows:
        return None
    final = max(row["phase"] for row in rows)
    peaks = [row.get("peak_allocated_bytes") for row in rows if row["phase"] == final and row["phase_step"] > 0]
    return max((peak for peak in peaks if peak is not None), default=None)
