"""One optimizer step's caching-allocator history (or a few steps'), to see why reserved memory grows.

`debug.memory_trace_step=K` (diagnostics.py) records the allocator's actions during step K on rank 0 (with
`debug.memory_trace_steps=N`, during steps K..K+N-1 as one recording; `steps` in the summary) and writes to the
run dir:
- `memory_snapshot.pickle`: torch's snapshot (open it at https://pytorch.org/memory_viz);
- `memory_trace.json`: its summary (`summarize`): per stream, the reserved and in-use bytes at the step's end;
  the device memory newly mapped during the step, grouped by the code that asked for it; and the peak of freed
  bytes the allocator could not reuse yet (blocks freed while another stream's work on them was still pending,
  i.e. `record_stream`): the memory a host running ahead of the device makes the pool grow by, with the frees
  pending at that peak grouped by the code that freed them;
- and, for each allocator retry during the step (`allocator_retries`), the request that missed, on which stream,
  and what the pool held just before the flush, per stream: mapped, live, deferred and cached-free bytes, so a
  reader can tell deferred frees, fragmentation, another stream's cache and a request too large for the headroom
  apart.
"""
from __future__ import annotations

import bisect
import itertools
import os
import pickle
from pathlib import Path
from typing import Any, Iterable, Iterator

from harness.contract import runfiles
from harness.contract.retry_trace import RETRY_READINGS

MAX_ENTRIES = 500_000           # allocator actions kept; beyond it torch drops the oldest
GROWTH_ACTIONS = ("segment_alloc", "segment_map")     # new device memory (cudaMalloc, or expandable mapping)
SHRINK_ACTIONS = ("segment_free", "segment_unmap")
TOP_SITES = 12
TOP_RETRIES = 20                # a trace with more retries than this already says enough


def start(device) -> None:
    """Begin recording allocator actions with Python stacks (cheaper than C++ ones)."""
    import torch

    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python", device=device)


def stop_and_write(run_dir: Path, device, steps: range | None = None) -> dict:
    """Snapshot, stop recording, write both files (the summary names the traced `steps`); returns the summary."""
    import torch

    snapshot = torch.cuda.memory._snapshot(device)
    torch.cuda.memory._record_memory_history(enabled=None, device=device)
    runfiles.write_atomic(run_dir / runfiles.MEMORY_SNAPSHOT, lambda tmp: _pickle_to(tmp, snapshot))
    summary = summarize(snapshot, torch.device(device).index or 0)
    if steps is not None:
        summary["steps"] = [steps[0], steps[-1]]  # first and last traced step
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
    pending at that peak grouped by (stream, the code that freed them): whose blocks the pool had to hold. A second
    replay stops at the peak instead of copying the pending set at every new peak."""
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


# How each action moves the pool's (mapped, live, deferred) bytes, per byte of its size. A free_completed always
# ends a deferred free, its free_requested seen in the trace or not: replaying backwards from the true end state
# needs no special case for blocks freed before the trace began (the forward replay above does, as it starts from
# an unknown state).
POOL_DELTAS = {"alloc": (0, 1, 0), "free_requested": (0, -1, 1), "free_completed": (0, 0, -1),
               "segment_alloc": (1, 0, 0), "segment_map": (1, 0, 0),
               "segment_free": (-1, 0, 0), "segment_unmap": (-1, 0, 0)}


def flush_bursts(trace: list[dict]) -> list[tuple[int, int]]:
    """(first index, last index + 1) of each maximal run of consecutive segment_free/segment_unmap entries."""
    bursts: list[tuple[int, int]] = []
    for index, entry in enumerate(trace):
        if entry["action"] not in SHRINK_ACTIONS:
            continue
        if bursts and bursts[-1][1] == index:
            bursts[-1] = (bursts[-1][0], index + 1)
        else:
            bursts.append((index, index + 1))
    return bursts


def _stack(entry: dict) -> list:
    return entry.get("frames", [])


def retry_request(trace: list[dict], burst: tuple[int, int]) -> int | None:
    """The index of the request a flush burst was a retry for, or None where the burst was no retry. One malloc call
    records all its entries with its own stack, so a retry's burst is followed, past the new mappings it makes room
    for, by the alloc (or the oom, when the retry failed too) with the burst's stack; torch.cuda.empty_cache()'s
    burst has the stack of its call. Without stacks recorded, every burst followed so counts."""
    index = burst[1]
    while index < len(trace) and trace[index]["action"] in GROWTH_ACTIONS:
        index += 1
    if (index < len(trace) and trace[index]["action"] in ("alloc", "oom")
            and _stack(trace[index]) == _stack(trace[burst[0]])):
        return index
    return None


def retry_flushes(trace: list[dict]) -> list[tuple[int, int, int]]:
    """(burst start, burst end, request index) of each flush burst that was an allocator retry, in order."""
    found = []
    for burst in flush_bursts(trace):
        request = retry_request(trace, burst)
        if request is not None:
            found.append((*burst, request))
    return found


def _completes_a_plain_free(trace: list[dict], index: int) -> bool:
    """Whether trace[index] (a free_completed) is the second half of a free no stream held: right after its own
    free_requested, with the same stack (a deferred free completed later carries the completing call's stack)."""
    previous = trace[index - 1] if index > 0 else None
    return (previous is not None and previous["action"] == "free_requested"
            and previous.get("addr") == trace[index].get("addr") and _stack(previous) == _stack(trace[index]))


def flush_start(trace: list[dict], burst_start: int) -> int:
    """Where the flush before `burst_start` began. The allocator synchronizes before it frees its cache, and that
    completes every free still waiting on another stream: free_completed entries right before the burst (with the
    malloc's stack). The pool as the missed request found it is the state before them. (The same malloc's first
    look at finished events writes the same entries; the trace cannot tell those apart: they count as deferred.)"""
    index = burst_start
    while (index > 0 and trace[index - 1]["action"] == "free_completed"
           and not _completes_a_plain_free(trace, index - 1)):
        index -= 1
    return index


def end_pool(segments: list[dict]) -> dict[int, list[int]]:
    """Per stream, [mapped, live, deferred] bytes at the snapshot (the trace's end): stream_summary's sums."""
    return {row["stream"]: [row["reserved_bytes"], row["allocated_bytes"], row["awaiting_free_bytes"]]
            for row in stream_summary(segments)}


def pools_before(trace: list[dict], segments: list[dict], indices: Iterable[int]) -> dict[int, dict[int, list[int]]]:
    """Per index, the pool per stream ([mapped, live, deferred] bytes) just before trace[index]: the end state less
    the deltas of trace[index:]. Backwards, because the trace starts mid-run (and torch drops its oldest entries)
    while the snapshot's segments give the true end. Trace sizes are requested sizes and the segments' are block
    sizes (rounded up), so live and deferred bytes are approximate by that rounding for blocks that cross `index`."""
    wanted = set(indices)
    earliest = min(wanted, default=len(trace))  # nothing before it is needed
    pool = end_pool(segments)
    found: dict[int, dict[int, list[int]]] = {}
    for index in range(len(trace) - 1, earliest - 1, -1):
        entry = trace[index]
        delta = POOL_DELTAS.get(entry["action"])
        if delta:
            row = pool.setdefault(entry.get("stream", 0), [0, 0, 0])
            for field, sign in enumerate(delta):
                row[field] -= sign * entry["size"]
        if index in wanted:
            found[index] = {stream: list(row) for stream, row in pool.items()}
    return found


def _without(ranges: set[tuple[int, int]], low: int, high: int) -> None:
    """Take [low, high) out of a set of address ranges."""
    for start, end in [r for r in ranges if r[0] < high and r[1] > low]:
        ranges.discard((start, end))
        ranges.update(piece for piece in ((start, low), (high, end)) if piece[0] < piece[1])


def _largest_gap(ranges: Iterable[tuple[int, int]], taken: list[tuple[int, int]]) -> int:
    """The longest run of bytes inside the mapped ranges that no block takes (`taken`: (address, size), sorted)."""
    largest = 0
    for low, high in sorted(ranges):
        start = bisect.bisect_left(taken, (low, -1))
        cursor = low
        for address, size in itertools.takewhile(lambda block: block[0] < high, taken[start:]):
            largest = max(largest, address - cursor)
            cursor = max(cursor, address + size)
        largest = max(largest, high - cursor)
    return largest


def largest_free_before(trace: list[dict], segments: list[dict], indices: Iterable[int]) -> dict[int, dict[int, int]]:
    """Per index, per stream, the largest free block just before trace[index]: the longest stretch of mapped memory
    that neither a live block nor one awaiting its free takes (what a request on that stream could have had without
    mapping more). Replayed backwards from the snapshot's segments, as pools_before; empty where the segments carry
    no addresses."""
    if not segments or any("address" not in segment for segment in segments):
        return {}
    mapped: dict[int, set[tuple[int, int]]] = {}
    taken: dict[int, tuple[int, int]] = {}  # address -> (size, stream)
    for segment in segments:
        start = segment["address"]
        mapped.setdefault(segment["stream"], set()).add((start, start + segment["total_size"]))
        taken.update((block["address"], (block["size"], segment["stream"])) for block in segment.get("blocks", [])
                     if block["state"] != "inactive")
    wanted = set(indices)
    found: dict[int, dict[int, int]] = {}
    for index in range(len(trace) - 1, min(wanted, default=len(trace)) - 1, -1):
        entry = trace[index]
        action, stream = entry["action"], entry.get("stream", 0)
        if action == "alloc":
            taken.pop(entry["addr"], None)
        elif action in ("free_requested", "free_completed"):  # before either half, the block was still taken
            taken.setdefault(entry["addr"], (entry["size"], stream))
        elif action in GROWTH_ACTIONS:
            _without(mapped.setdefault(stream, set()), entry["addr"], entry["addr"] + entry["size"])
        elif action in SHRINK_ACTIONS:
            mapped.setdefault(stream, set()).add((entry["addr"], entry["addr"] + entry["size"]))
        if index in wanted:
            found[index] = {stream_id: _largest_gap(ranges, sorted((address, size) for address, (size, owner)
                                                                   in taken.items() if owner == stream_id))
                            for stream_id, ranges in mapped.items()}
    return found


def _pool_row(mapped: int, live: int, deferred: int) -> dict[str, int]:
    return {"mapped_bytes": mapped, "live_bytes": live, "deferred_bytes": deferred,
            "cached_free_bytes": mapped - live - deferred}


def pool_table(pool: dict[int, list[int]]) -> dict:
    """A pool as JSON rows: per stream (streams holding nothing left out, largest mapped first) and in total."""
    rows = [{"stream": stream, **_pool_row(*row)} for stream, row in pool.items() if any(row)]
    total = _pool_row(*(sum(row[field] for row in pool.values()) for field in range(3)))
    return {"streams": sorted(rows, key=lambda row: -row["mapped_bytes"]), "total": total}


def missed_request(entry: dict, index: int, skip_prefix: str) -> dict:
    """The request a retry was for, as JSON."""
    return {"index": index, "bytes": entry["size"], "stream": entry.get("stream", 0),
            "where": where(_stack(entry), skip_prefix), "oom": entry["action"] == "oom"}


def retry_reading(missed: dict, before: dict) -> str:
    """One word for why the request missed (see allocator_retries)."""
    size, rows = missed["bytes"], before["streams"]
    own_cache = sum(row["cached_free_bytes"] for row in rows if row["stream"] == missed["stream"])
    deferred, fragmentation, other_stream, headroom = RETRY_READINGS
    if before["total"]["deferred_bytes"] >= size:
        return deferred
    if own_cache >= size:
        return fragmentation
    if before["total"]["cached_free_bytes"] >= size:
        return other_stream
    return headroom


def allocator_retries(trace: list[dict], segments: list[dict], top: int = TOP_RETRIES,
                      flushes: list[tuple[int, int, int]] | None = None) -> list[dict]:
    """The first `top` allocator retries in the trace, in order. A retry is an alloc the pool could not serve with
    no room left to map more: the allocator synchronizes (completing frees that waited on other streams), frees
    every wholly free cached segment -- a burst of consecutive segment_free/segment_unmap entries -- and maps again
    (`retry_request` tells such a burst from an empty_cache's). A retry that found no whole segment to free leaves
    no burst and is not seen; with max_split_size_mb or garbage_collection_threshold set, the allocator's partial
    releases inside a malloc look like retries and count as such.

    Per retry: `index` (the burst's first entry), `missed` (the request: index, bytes, stream, code site, whether it
    ended in an oom), `before` (the pool per stream and in total just before the flush: mapped, live, deferred =
    freed but awaiting another stream's work, cached_free = mapped - live - deferred; and, where the snapshot
    carries addresses, `largest_free_block_bytes`: the largest free block the request's stream had),
    `released_bytes` (what the burst unmapped) and `reading`, the first that holds of:
    - "deferred": the deferred bytes alone would have held the request (record_stream frees not yet reusable);
    - "fragmentation": the cache on the request's own stream would have, but no free block there was large enough;
    - "other_stream": the cache of all streams together would have: it needed other streams' cache (a stream
      cannot use another's blocks);
    - "headroom": none of these: the live bytes leave too little room under the limit.
    `flushes`: retry_flushes(trace), where the caller has it already."""
    flushes = (retry_flushes(trace) if flushes is None else flushes)[:top]
    starts = [flush_start(trace, first) for first, _, _ in flushes]
    pools = pools_before(trace, segments, starts)
    largest_free = largest_free_before(trace, segments, starts)
    skip_prefix = torch_package_dir() if flushes else ""
    retries = []
    for (first, end, request), start in zip(flushes, starts):
        missed = missed_request(trace[request], request, skip_prefix)
        before = {"index": start, **pool_table(pools[start])}
        if start in largest_free:  # the request's own stream: a fragmentation reading has no block this large
            before["largest_free_block_bytes"] = largest_free[start].get(missed["stream"], 0)
        retries.append({"index": first, "missed": missed, "before": before,
                        "released_bytes": sum(entry["size"] for entry in trace[first:end]),
                        "reading": retry_reading(missed, before)})
    return retries


def summarize(snapshot: dict, device_index: int = 0) -> dict:
    traces = snapshot.get("device_traces") or []
    trace = traces[device_index] if device_index < len(traces) else []
    segments = [segment for segment in snapshot.get("segments", [])
                if segment.get("device", device_index) == device_index]
    streams = stream_summary(segments)
    deferred_peak, deferred_sites = deferred_frees(trace)
    flushes = retry_flushes(trace)
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
        "retry_count": len(flushes),
        "retries": allocator_retries(trace, segments, flushes=flushes),
    }
