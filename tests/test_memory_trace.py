"""The allocator-trace summary on hand-made snapshots in torch's format (the recording itself needs CUDA)."""
from __future__ import annotations

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
