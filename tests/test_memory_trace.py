"""The allocator-trace summary on hand-made snapshots in torch's format (the recording itself needs CUDA)."""
from __future__ import annotations

import pytest

from harness.rank import memory_trace

TORCH_FRAME = {"filename": memory_trace.torch_package_dir() + "cuda/memory.py", "line": 10, "name": "alloc"}
# a checkout under a directory named torch must still count as the caller's code
RELOAD = {"filename": "/opt/torch/repo/harness/offload/mover.py", "line": 141, "name": "reload"}
RUNTIME = {"filename": "/opt/torch/repo/harness/offload/runtime.py", "line": 120, "name": "_reload"}
KERNEL = {"filename": "/tmp/torchinductor_root/ab/cabc.py", "line": 77, "name": "call"}


def segment(stream, blocks):
    sizes = {state: sum(size for s, size in blocks if s == state) for state, _ in blocks}
    return {"stream": stream, "total_size": sum(size for _, size in blocks),
            "allocated_size": sizes.get("active_allocated", 0),
            "active_size": sizes.get("active_allocated", 0) + sizes.get("active_awaiting_free", 0),
            "blocks": [{"state": state, "size": size} for state, size in blocks]}


def test_streams_sum_reserved_in_use_awaiting_and_largest_free_block():
    snapshot = {"segments": [segment(0, [("active_allocated", 100), ("inactive", 30), ("inactive", 50)]),
                             segment(0, [("active_awaiting_free", 40), ("inactive", 20)]),
                             segment(7, [("active_allocated", 8)]),
                             {**segment(0, [("active_allocated", 1000)]), "device": 1}],  # another GPU's
                "device_traces": [[]]}
    summary = memory_trace.summarize(snapshot)
    assert summary["reserved_bytes"] == 248 and summary["allocated_bytes"] == 108
    compute, other = summary["streams"]
    assert compute == {"stream": 0, "segments": 2, "reserved_bytes": 240, "allocated_bytes": 100,
                       "awaiting_free_bytes": 40, "largest_free_block_bytes": 50}
    assert other["stream"] == 7 and other["largest_free_block_bytes"] == 0


def test_growth_is_grouped_by_stream_and_the_first_frames_outside_torch():
    trace = [{"action": "segment_map", "size": 64, "stream": 0, "frames": [TORCH_FRAME, RELOAD, RUNTIME]},
             {"action": "alloc", "size": 64, "stream": 0, "addr": 1, "frames": [RELOAD]},
             {"action": "segment_map", "size": 32, "stream": 0, "frames": [TORCH_FRAME, RELOAD, RUNTIME]},
             {"action": "segment_alloc", "size": 200, "stream": 3, "frames": [KERNEL]},
             {"action": "segment_unmap", "size": 16, "stream": 0, "frames": []}]
    summary = memory_trace.summarize({"segments": [], "device_traces": [trace]})
    assert summary["mapped_bytes"] == 296 and summary["unmapped_bytes"] == 16
    assert summary["growth_sites"] == [
        {"stream": 3, "where": "cabc.py:77 call", "bytes": 200, "count": 1},
        {"stream": 0, "where": "mover.py:141 reload < runtime.py:120 _reload", "bytes": 96, "count": 2}]


def test_deferred_frees_peak_while_blocks_await_other_streams():
    trace = [{"action": "free_requested", "addr": 1, "size": 10},
             {"action": "free_completed", "addr": 1, "size": 10},  # an ordinary free completes at once
             {"action": "free_requested", "addr": 2, "size": 40},   # record_stream: waits for the copy
             {"action": "free_requested", "addr": 3, "size": 25},
             {"action": "free_completed", "addr": 2, "size": 40},
             {"action": "free_completed", "addr": 9, "size": 99},   # requested before the trace began
             {"action": "free_requested", "addr": 4, "size": 5}]
    assert memory_trace.deferred_frees(trace)[0] == 65


def test_deferred_frees_at_their_peak_are_grouped_by_the_code_that_freed_them():
    trace = [{"action": "free_requested", "addr": 1, "size": 30, "stream": 0, "frames": [TORCH_FRAME, KERNEL]},
             {"action": "free_requested", "addr": 2, "size": 20, "stream": 0, "frames": [KERNEL]},
             {"action": "free_requested", "addr": 3, "size": 40, "stream": 5, "frames": [RELOAD, RUNTIME]},
             {"action": "free_completed", "addr": 1, "size": 30},  # peak (90) was just before this
             {"action": "free_requested", "addr": 4, "size": 35, "stream": 5, "frames": [RELOAD]}]  # 95: new peak
    summary = memory_trace.summarize({"segments": [], "device_traces": [trace]})
    assert summary["peak_deferred_free_bytes"] == 95
    assert summary["deferred_free_sites"] == [
        {"stream": 5, "where": "mover.py:141 reload < runtime.py:120 _reload", "bytes": 40, "count": 1},
        {"stream": 5, "where": "mover.py:141 reload", "bytes": 35, "count": 1},
        {"stream": 0, "where": "cabc.py:77 call", "bytes": 20, "count": 1}]


def test_a_trace_without_device_traces_summarizes_to_zeros():
    summary = memory_trace.summarize({"segments": []}, device_index=1)
    assert summary["trace_entries"] == summary["mapped_bytes"] == summary["peak_deferred_free_bytes"] == 0
    assert summary["growth_sites"] == summary["deferred_free_sites"] == summary["streams"] == []


# Allocator retries: the flush burst, the request that missed and the pool just before the flush. torch records
# every entry of one malloc call with that call's stack (as a trace from an H200 showed: the synchronize's
# free_completed, the burst, the new segment and the alloc), a free with the free's.
MALLOC = [TORCH_FRAME, RELOAD, RUNTIME]
EMPTY_CACHE = [{"filename": memory_trace.torch_package_dir() + "cuda/memory.py", "line": 224, "name": "empty_cache"},
               {"filename": "/opt/torch/repo/harness/rank/worker.py", "line": 88, "name": "step"}]


def entry(action, size, stream=0, addr=0, frames=()):
    return {"action": action, "size": size, "stream": stream, "addr": addr, "frames": list(frames)}


def pool(stream, mapped, live, deferred):
    return {"stream": stream, "mapped_bytes": mapped, "live_bytes": live, "deferred_bytes": deferred,
            "cached_free_bytes": mapped - live - deferred}


def without_stream(row):
    return {key: value for key, value in row.items() if key != "stream"}


def test_a_retry_behind_a_free_awaiting_another_stream_reads_deferred():
    segments = [segment(0, [("active_allocated", 128)]), segment(0, [("active_allocated", 128)])]
    trace = [entry("free_requested", 128, addr=1, frames=[KERNEL]),  # record_stream: another stream still reads it
             entry("free_completed", 128, addr=1, frames=MALLOC),   # completed by the flush's synchronize
             entry("segment_free", 128, frames=MALLOC),
             entry("segment_alloc", 128, frames=MALLOC),
             entry("alloc", 128, addr=3, frames=MALLOC)]
    [retry] = memory_trace.allocator_retries(trace, segments)
    row = pool(0, 256, 128, 128)
    assert retry == {"index": 2,
                     "missed": {"index": 4, "bytes": 128, "stream": 0, "oom": False,
                                "where": "mover.py:141 reload < runtime.py:120 _reload"},
                     "before": {"index": 1, "streams": [row], "total": without_stream(row)},
                     "released_bytes": 128, "reading": "deferred"}


@pytest.mark.parametrize("free_stack, malloc_stack", [([KERNEL], MALLOC), ([], [])], ids=["stacks", "no stacks"])
def test_a_plain_free_just_before_the_flush_is_not_taken_for_its_synchronize(free_stack, malloc_stack):
    segments = [segment(0, [("active_allocated", 64)]), segment(0, [("active_allocated", 192)])]
    trace = [entry("free_requested", 64, addr=2, frames=free_stack),
             entry("free_completed", 64, addr=2, frames=free_stack),    # a plain free: both halves back to back
             entry("free_completed", 128, addr=1, frames=malloc_stack),  # the synchronize (requested before the trace)
             entry("segment_free", 128, frames=malloc_stack),
             entry("segment_alloc", 192, frames=malloc_stack),
             entry("alloc", 192, addr=4, frames=malloc_stack)]
    [retry] = memory_trace.allocator_retries(trace, segments)
    assert retry["before"]["index"] == 2 and retry["before"]["streams"] == [pool(0, 192, 64, 128)]
    assert retry["reading"] == "headroom"  # 128 deferred, nothing cached: short of 192 either way


def test_a_retry_with_enough_cache_on_its_own_stream_reads_fragmentation():
    segments = [segment(0, [("active_allocated", 64), ("inactive", 64), ("active_allocated", 64), ("inactive", 64)]),
                segment(0, [("active_allocated", 128)]),
                segment(7, [("active_allocated", 32)])]
    trace = [entry("free_requested", 64, addr=10, frames=[KERNEL]),
             entry("free_completed", 64, addr=10, frames=[KERNEL]),  # leaves a hole: 128 cached, no block of 128
             entry("segment_free", 64, frames=MALLOC),               # the only wholly free segment
             entry("segment_alloc", 128, frames=MALLOC),
             entry("alloc", 128, addr=11, frames=MALLOC)]
    [retry] = memory_trace.allocator_retries(trace, segments)
    assert retry["before"] == {"index": 2, "streams": [pool(0, 320, 128, 0), pool(7, 32, 32, 0)],
                               "total": without_stream(pool(None, 352, 160, 0))}
    assert retry["released_bytes"] == 64 and retry["reading"] == "fragmentation"


def test_a_retry_that_needed_another_streams_cache_reads_other_stream():
    segments = [segment(0, [("active_allocated", 128), ("inactive", 64)]), segment(0, [("active_allocated", 128)])]
    trace = [entry("alloc", 256, stream=7, addr=20, frames=[KERNEL]),  # a copy stream's buffer, cached there once freed
             entry("free_requested", 256, stream=7, addr=20, frames=[KERNEL]),
             entry("free_completed", 256, stream=7, addr=20, frames=[KERNEL]),
             entry("segment_free", 256, stream=7, frames=MALLOC),
             entry("segment_alloc", 128, frames=MALLOC),
             entry("alloc", 128, addr=21, frames=MALLOC)]
    [retry] = memory_trace.allocator_retries(trace, segments)
    assert retry["before"]["index"] == 3
    assert retry["before"]["streams"] == [pool(7, 256, 0, 0), pool(0, 192, 128, 0)]  # 64 cached here: short
    assert retry["missed"]["stream"] == 0 and retry["reading"] == "other_stream"


def test_a_trace_without_a_flush_has_no_retries():
    segments = [segment(0, [("active_allocated", 64), ("inactive", 64)])]
    trace = [entry("segment_map", 128), entry("alloc", 64, addr=1), entry("alloc", 64, addr=2),
             entry("free_requested", 64, addr=2), entry("free_completed", 64, addr=2)]
    assert memory_trace.allocator_retries(trace, segments) == []
    summary = memory_trace.summarize({"segments": segments, "device_traces": [trace]})
    assert summary["retry_count"] == 0 and summary["retries"] == []
    assert summary["mapped_bytes"] == 128 and summary["growth_sites"]  # the other keys stay as they were


def test_an_empty_cache_is_a_flush_but_no_retry():
    trace = [entry("segment_free", 64, frames=EMPTY_CACHE),             # empty_cache: its own call's stack
             entry("segment_alloc", 32, frames=MALLOC), entry("alloc", 32, addr=1, frames=MALLOC),
             entry("segment_unmap", 16, frames=MALLOC),                 # a retry: the alloc's stack
             entry("segment_map", 48, frames=MALLOC), entry("alloc", 48, addr=2, frames=MALLOC)]
    segments = [segment(0, [("active_allocated", 32)]), segment(0, [("active_allocated", 48)])]
    summary = memory_trace.summarize({"segments": segments, "device_traces": [trace]})
    assert summary["retry_count"] == 1 and [retry["index"] for retry in summary["retries"]] == [3]


def test_each_burst_followed_by_its_request_is_one_retry_in_order_up_to_top():
    trace = [entry("segment_free", 10), entry("segment_unmap", 20),  # one burst
             entry("alloc", 5, addr=1),
             entry("segment_free", 30),
             entry("oom", 40),                                       # the retry failed too
             entry("segment_unmap", 6),
             entry("free_requested", 5, addr=1),                     # other work first: no retry
             entry("alloc", 5, addr=3),
             entry("segment_unmap", 8)]                              # no request after it
    segments = [segment(0, [("active_allocated", 5)])]
    assert memory_trace.flush_bursts(trace) == [(0, 2), (3, 4), (5, 6), (8, 9)]
    assert memory_trace.retry_flushes(trace) == [(0, 2, 2), (3, 4, 4)]
    [first] = memory_trace.allocator_retries(trace, segments, top=1)
    assert (first["index"], first["released_bytes"], first["missed"]["bytes"]) == (0, 30, 5)
    second = memory_trace.allocator_retries(trace, segments)[-1]
    assert second["missed"]["oom"] and second["missed"]["bytes"] == 40
    assert memory_trace.summarize({"segments": segments, "device_traces": [trace]})["retry_count"] == 2


def test_retry_count_counts_every_retry_beyond_those_listed():
    many = memory_trace.TOP_RETRIES + 1
    trace = [step for _ in range(many) for step in (entry("segment_free", 8), entry("alloc", 8))]
    summary = memory_trace.summarize({"segments": [], "device_traces": [trace]})
    assert summary["retry_count"] == many and len(summary["retries"]) == memory_trace.TOP_RETRIES


def test_the_pool_table_leaves_out_streams_holding_nothing():
    table = memory_trace.pool_table({0: [100, 40, 10], 5: [0, 0, 0], 7: [300, 0, 0]})
    assert table == {"streams": [pool(7, 300, 0, 0), pool(0, 100, 40, 10)],
                     "total": without_stream(pool(None, 400, 40, 10))}


def test_replaying_backwards_from_the_segments_recovers_the_state_before_the_trace():
    # start: stream 0 maps 512, 200 live, 100 freed before the trace and awaiting another stream; stream 3 maps 64
    trace = [entry("free_completed", 100, addr=5),       # its free_requested predates the trace
             entry("alloc", 50, addr=6),
             entry("segment_map", 256, stream=3),
             entry("alloc", 200, stream=3, addr=7),
             entry("free_requested", 64, stream=3, addr=8),  # still awaiting at the end
             entry("free_requested", 200, addr=9),
             entry("free_completed", 200, addr=9),
             entry("segment_free", 256),
             entry("snapshot", 0)]
    end = [segment(0, [("active_allocated", 50), ("inactive", 206)]),
           segment(3, [("active_allocated", 200), ("active_awaiting_free", 64), ("inactive", 56)])]
    pools = memory_trace.pools_before(trace, end, [0, 5])
    assert pools[0] == {0: [512, 200, 100], 3: [64, 64, 0]}
    assert pools[5] == {0: [512, 250, 0], 3: [320, 200, 64]}


def placed(stream, address, blocks):
    """A segment at an address, its blocks laid end to end from it (as torch's snapshot gives them)."""
    laid, cursor = [], address
    for state, size in blocks:
        laid.append({"state": state, "size": size, "address": cursor})
        cursor += size
    return {**segment(stream, blocks), "address": address, "blocks": laid}


def test_the_largest_free_block_before_a_retry_is_replayed_from_the_addresses():
    """Stream 0 held 192 free bytes before the flush, but in blocks of 64 and 128 between live ones: a request of 160
    missed (fragmentation), and the record says no free block was larger than 128. After the flush the trace maps
    and allocates; the replay undoes both to find the pool as the request did."""
    end = [placed(0, 1000, [("active_allocated", 100), ("inactive", 64), ("active_allocated", 36),
                            ("inactive", 128), ("active_allocated", 32)]),
           placed(0, 5000, [("active_allocated", 160)]),       # mapped by the retry, then taken by the request
           placed(7, 9000, [("inactive", 256)])]               # another stream's cache: out of reach
    trace = [entry("free_requested", 128, addr=1200, frames=[KERNEL]),  # the last block freed before the miss
             entry("free_completed", 128, addr=1200, frames=[KERNEL]),
             entry("segment_unmap", 64, stream=0, addr=9500, frames=MALLOC),  # the flush (a wholly free piece)
             entry("segment_map", 160, stream=0, addr=5000, frames=MALLOC),
             entry("alloc", 160, addr=5000, frames=MALLOC)]
    [retry] = memory_trace.allocator_retries(trace, end)
    assert retry["reading"] == "fragmentation" and retry["missed"]["bytes"] == 160
    assert retry["before"]["largest_free_block_bytes"] == 128
    before_free = memory_trace.largest_free_before(trace, end, [0])[0]
    assert before_free[0] == 64  # before the 128-byte block was freed, only the 64-byte hole was free


def test_without_addresses_no_largest_free_block_is_claimed():
    segments = [segment(0, [("active_allocated", 64), ("inactive", 64)])]
    assert memory_trace.largest_free_before([entry("alloc", 8, addr=1)], segments, [0]) == {}
