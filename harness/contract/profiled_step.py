"""What a profiled step's torch_trace.json (`debug.profile_step`, harness/rank/diagnostics.py: torch.profiler's
Chrome trace of one step on rank 0) says of where its host and device time went, as a reader of someone else's run
dir needs it. Read as JSON only, through safe_read (a trace is data, never code); the events it sums:
- the step's span: first event start to last event end, host and device;
- device busy: the union of the device's kernels, copies and memsets over all its streams;
- synchronisations: host time in the CUDA runtime's device, stream and event synchronize calls;
- the allocator: host time in the runtime's cudaMalloc/cudaFree and the driver's mapping calls behind expandable
  segments (cuMemCreate, cuMemMap, ...), where a retry's flush and new mapping show;
- our ops: host time in the offload pass's custom ops (namespace `offload_harness`, harness/offload/ops.py);
- eager ops: ATen operator calls outside compiled code (no compiled region, and no other ATen call, around them on
  their thread), where a graph break or an eager fallback runs; an eager optimizer's step and autograd's gradient
  accumulation count too, in every arm alike.
Each is a union of intervals per host thread, so an event nested in another of its kind counts once.
A committed campaign keeps these sums instead of the trace (profiled_step.json, written by `harness archive`).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from harness.contract import safe_read
from harness.contract.checks import is_finite_number

OUR_OPS_PREFIX = "offload_harness::"  # harness/offload/ops.py's NAMESPACE (the contract does not import the pass)
SYNC_CALLS = frozenset({"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize"})
ALLOCATOR_CALLS = frozenset({"cudaMalloc", "cudaFree", "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap",
                             "cuMemSetAccess", "cuMemAddressReserve", "cuMemAddressFree"})
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
OPERATOR_CATEGORY = "cpu_op"
ATEN_PREFIX = "aten::"
# Names of the events around compiled code: Dynamo's region, AOTAutograd's forward and backward functions, and
# inductor's graph call; an operator inside one of them is compiled code's, not an eager fallback.
COMPILED_REGION_PREFIXES = ("Torch-Compiled Region", "CompiledFunction", "## Call CompiledFxGraph")
MICROSECONDS = 1e-6  # the Chrome trace's unit


class NotAProfiledStep(ValueError):
    """torch_trace.json holds no Chrome trace of a step."""


@dataclass(frozen=True)
class ProfiledStep:
    """One profiled step's seconds (and calls) by where they went."""
    span_s: float
    device_busy_s: float
    sync_s: float
    syncs: int
    allocator_s: float
    allocator_calls: int
    our_ops_s: float
    our_ops: int
    eager_ops_s: float
    eager_ops: int


@dataclass(frozen=True)
class _Event:
    name: str
    category: str
    thread: tuple[str, str]
    start: float
    end: float


def _events(trace: Any) -> list[_Event]:
    """The complete events ("ph": "X") of a parsed trace, in microseconds."""
    if not isinstance(trace, Mapping) or not isinstance(trace.get("traceEvents"), list):
        raise NotAProfiledStep("not a Chrome trace (an object with a traceEvents list)")
    events = []
    for event in trace["traceEvents"]:
        if not isinstance(event, Mapping) or event.get("ph") != "X":
            continue
        start, duration = event.get("ts"), event.get("dur")
        if not all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in (start, duration)) \
                or duration < 0:
            raise NotAProfiledStep("a complete event without a numeric ts and a dur >= 0")
        events.append(_Event(str(event.get("name", "")), str(event.get("cat", "")),
                             (str(event.get("pid")), str(event.get("tid"))), float(start), float(start + duration)))
    if not events:
        raise NotAProfiledStep("no complete events")
    return events


def union_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals in microseconds, as seconds."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total * MICROSECONDS


def _host_seconds(events: Iterable[_Event]) -> tuple[float, int]:
    """Seconds of the union per thread, summed over threads, and the number of events."""
    by_thread: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for event in events:
        by_thread[event.thread].append((event.start, event.end))
    return float(sum(union_seconds(intervals) for intervals in by_thread.values())), sum(map(len, by_thread.values()))


def _is_compiled_region(event: _Event) -> bool:
    return event.name.startswith(COMPILED_REGION_PREFIXES)


def _is_aten(event: _Event) -> bool:
    return event.category == OPERATOR_CATEGORY and event.name.startswith(ATEN_PREFIX)


def eager_operators(events: Iterable[_Event]) -> list[_Event]:
    """ATen calls with no compiled region and no other ATen call around them on their thread."""
    by_thread: dict[tuple[str, str], list[_Event]] = defaultdict(list)
    for event in events:
        if event.category == OPERATOR_CATEGORY:
            by_thread[event.thread].append(event)
    eager = []
    for thread_events in by_thread.values():
        enclosing: list[_Event] = []  # the events open at the current one's start, outermost first
        for event in sorted(thread_events, key=lambda e: (e.start, -e.end)):
            while enclosing and enclosing[-1].end <= event.start:
                enclosing.pop()
            if _is_aten(event) and not any(_is_compiled_region(outer) or _is_aten(outer) for outer in enclosing):
                eager.append(event)
            enclosing.append(event)
    return eager


def profiled_step(trace: Any) -> ProfiledStep:
    """The seconds of a parsed torch_trace.json; NotAProfiledStep where it is no Chrome trace."""
    events = _events(trace)
    device = [(event.start, event.end) for event in events if event.category in DEVICE_CATEGORIES]
    sync_s, syncs = _host_seconds(event for event in events if event.name in SYNC_CALLS)
    allocator_s, allocator_calls = _host_seconds(event for event in events if event.name in ALLOCATOR_CALLS)
    ours_s, ours = _host_seconds(event for event in events
                                 if event.category == OPERATOR_CATEGORY and event.name.startswith(OUR_OPS_PREFIX))
    eager_s, eager = _host_seconds(eager_operators(events))
    span = (max(event.end for event in events) - min(event.start for event in events)) * MICROSECONDS
    return ProfiledStep(span, union_seconds(device), sync_s, syncs, allocator_s, allocator_calls, ours_s, ours,
                        eager_s, eager)


def read_profiled_step(path: Path, root: Path | None = None) -> ProfiledStep | None:
    """The profiled step of a run dir's torch_trace.json, None without the file; safe_read.RefusedFile, OSError,
    ValueError (not JSON) or NotAProfiledStep for a file that is not one."""
    return safe_read.read_optional_json(path, root, profiled_step)


def from_record(record: Any) -> ProfiledStep:
    """profiled_step.json's object as a ProfiledStep: exactly its fields, seconds as finite numbers >= 0 and counts as
    integers >= 0; NotAProfiledStep for anything else."""
    names = [field.name for field in fields(ProfiledStep)]
    if not isinstance(record, Mapping) or sorted(record) != sorted(names):
        raise NotAProfiledStep(f"not a profiled step's sums (the keys {', '.join(names)})")
    for name in names:
        value = record[name]
        counted = not name.endswith("_s")
        usable = type(value) is int if counted else is_finite_number(value)
        if not usable or value < 0:
            raise NotAProfiledStep(f"{name}: must be {'a count' if counted else 'seconds'} >= 0, got {value!r}")
    return ProfiledStep(**{name: record[name] for name in names})


def read_profiled_sums(path: Path, root: Path | None = None) -> ProfiledStep | None:
    """A committed run dir's profiled_step.json, None without the file; as read_profiled_step for one that is not
    one."""
    return safe_read.read_optional_json(path, root, from_record)
