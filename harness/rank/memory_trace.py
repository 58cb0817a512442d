"""One optimizer step's caching-allocator history, to see why reserved memory grows.

`debug.memory_trace_step=K` (diagnostics.py) records the allocator's actions during step K on rank 0 and writes
to the run dir:
- `memory_snapshot.pickle`: torch's snapshot (open it at https://pytorch.org/memory_viz);
- `memory_trace.json`: its summary (`summarize`): per stream, the reserved and in-use bytes at the step's end;
  the device memory newly mapped during the step, grouped by the code that asked for it; and the peak of freed
  bytes the allocator could not reuse yet (blocks freed while another stream's work on them was still pending,
  i.e. `record_stream`): the memory a host running ahead of the device makes the pool grow by, with the frees
  pending at that peak grouped by the code that freed them.
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any, Iterable, Iterator

from harness.contract import runfiles

MAX_ENTRIES = 500_000           # allocator actions kept; beyond it torch drops the oldest
GROWTH_ACTIONS = ("segment_alloc", "segment_map")     # new device memory (cudaMalloc, or expandable mapping)
SHRINK_ACTIONS = ("segment_free", "segment_unmap")
TOP_SITES = 12


def start(device) -> None:
    """Begin recording allocator actions with Python stacks (cheaper than C++ ones)."""
    import torch

    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python", device=device)


def stop_and_write(run_dir: Path, device) -> dict:
    """Snapshot, stop recording, write both files; returns the summary."""
    import torch

    snapshot = torch.cuda.memory._snapshot(device)
    torch.cuda.memory._record_memory_history(enabled=None, device=device)
    runfiles.write_atomic(run_dir / runfiles.MEMORY_SNAPSHOT, lambda tmp: _pickle_to(tmp, snapshot))
    summary = summarize(snapshot, torch.device(device).index or 0)
    runfiles.write_json(run_dir / runfiles.MEMORY_TRACE, summary)
    return summary


def _pickle_to(path: Path, obj: Any) -> None:
    with open(path, "wb") as handle:  # streamed: a snapshot can be larger than a second copy of it in memory
        pickle.dump(obj, handle)


def torch_package_dir() -> str:
    import torch

    return os.path.dirname(torch.__file__) + os.sep


def where(frames: Iterable[dict], skip_prefix: str, depth: int = 2) -> str:
    """The innermost `depth` frames outside `skip_prefix` (torch's own package): the code that asked for the
    memory (inductor's generated modules live elsewhere and count as the caller's code)."""
    ours = [f for f in frames if not f.get("filename", "").startswith(skip_prefix)]
    return " < ".join(f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}" for f in ours[:depth]) or "?"


def stream_summary(segments: list[dict]) -> list[dict]:
    """Per stream: segments, reserved, allocated, awaiting-free bytes and the largest free block."""
    by_stream: dict[int, dict[str, Any]] = {}
    for segment in segments:
        row = by_stream.setdefault(segment["stream"], {"stream": segment["stream"], "segments": 0,
                                                       "reserved_bytes": 0, "allocated_bytes": 0,
                                                       "awaiting_free_bytes": 0, "largest_free_block_bytes": 0})
        row["segments"] += 1
        row["reserved_bytes"] += segment["total_size"]
        row["allocated_bytes"] += segment["allocated_size"]
        row["awaiting_free_bytes"] += segment["active_size"] - segment["allocated_size"]
        free = [block["size"] for block in segment.get("blocks", []) if block["state"] == "inactive"]
        row["largest_free_block_bytes"] = max([row["largest_free_block_bytes"], *free])
    return sorted(by_stream.values(), key=lambda row: -row["reserved_bytes"])


def _by_site(entries: Iterable[dict], top: int) -> list[dict]:
    """Trace entries grouped by (stream, code site), largest total size first."""
    skip_prefix = torch_package_dir()
    sites: dict[tuple[int, str], dict[str, Any]] = {}
    for entry in entries:
        key = (entry.get("stream", 0), where(entry.get("frames", []), skip_prefix))
        site = sites.setdefault(key, {"stream": key[0], "where": key[1], "bytes": 0, "count": 0})
        site["bytes"] += entry["size"]
        site["count"] += 1
    return sorted(sites.values(), key=lambda site: -site["bytes"])[:top]


def growth_sites(trace: list[dict], top: int = TOP_SITES) -> list[dict]:
    """New device memory during the trace, grouped by (stream, code site), largest first."""
    return _by_site((entry for entry in trace if entry["action"] in GROWTH_ACTIONS), top)


def _replay_frees(trace: list[dict], stop: int | None = None) -> Iterator[tuple[int, int, dict[int, dict]]]:
    """(index, bytes freed but not yet reusable, those frees by address) after each entry before `stop`."""
    pending: dict[int, dict] = {}
    running = 0
    for index, entry in enumerate(trace[:stop]):
        if entry["action"] == "free_requested":
            pending[entry["addr"]] = entry
            running += entry["size"]
        elif entry["action"] == "free_completed" and entry["addr"] in pending:
            running -= pending.pop(entry["addr"])["size"]
        yield index, running, pending


def deferred_frees(trace: list[dict], top: int = TOP_SITES) -> tuple[int, list[dict]]:
    """The most bytes at once that were freed (free_requested) but not yet reusable (free_completed) -- the
    allocator completes a free only once every stream recorded on the block has passed its event -- and the frees
    pending at that peak grouped by (stream, the code that freed them): whose blocks the pool had to hold. A second replay stops at the peak instead of copying the pending set at every new peak."""
    peak, peak_index = 0, None
    for index, running, _ in _replay_frees(trace):
        if running > peak:
            peak, peak_index = running, index
    if peak_index is None:
        return 0, []
    at_peak: dict[int, dict] = {}
    for _, _, at_peak in _replay_frees(trace, peak_index + 1):
        pass  # the replay's pending frees after the peak's entry
    return peak, _by_site(at_peak.values(), top)


def summarize(snapshot: dict, device_index: int = 0) -> dict:
    traces = snapshot.get("device_traces") or []
    trace = traces[device_index] if device_index < len(traces) else []
    streams = stream_summary([segment for segment in snapshot.get("segments", [])
                              if segment.get("device", device_index) == device_index])
    deferred_peak, deferred_sites = deferred_frees(trace)
    return {
        "reserved_bytes": sum(row["reserved_bytes"] for row in streams),
        "allocated_bytes": sum(row["allocated_bytes"] for row in streams),
        "streams": streams,
        "trace_entries": len(trace),
        "mapped_bytes": sum(e["size"] for e in trace if e["action"] in GROWTH_ACTIONS),
        "unmapped_bytes": sum(e["size"] for e in trace if e["action"] in SHRINK_ACTIONS),
        "growth_sites": growth_sites(trace),
        "peak_deferred_free_bytes": deferred_peak,
        "deferred_free_sites": deferred_sites,
        "ooms": sum(1 for e in trace if e["action"] == "oom"),
    }
