"""Copy stalls and copy-stream busy time (stalls.py), the race-stress delay and the allocator readings of our ops,
on the fake device: its clock advances by `wait_ms` at each compute-stream wait and by each device sleep."""
from __future__ import annotations

import pytest
import torch

from harness.offload import ops
from harness.offload.mover import StateMover
from harness.offload.runtime import EmptyCachePolicy, OffloadRuntime
from harness.offload.stalls import D2H_BUSY, H2D_BUSY, STALL, StallRecorder
from harness.offload.states import discover_tasks
from offload_fakes import FakeDevice, FakeZero3Optimizer

ops.register_ops()


def mover_with_states(copy_delay_us=0, split=True):
    device = FakeDevice()
    mover = StateMover(device, split_streams=split, copy_delay_us=copy_delay_us)
    runtime = OffloadRuntime(mover, "async", EmptyCachePolicy("never", device.empty_cache))
    runtime.adopt(discover_tasks(FakeZero3Optimizer()))
    return mover, runtime, device


def test_compute_waits_are_timed_between_events_on_the_compute_stream():
    device = FakeDevice()
    recorder = StallRecorder(device)
    device.clock.wait_ms = 2.5
    for _ in range(3):
        recorder.compute_waits(device.new_event())
    assert [entry[0] for entry in device.log] == ["wait_event"] * 3
    assert recorder.collect()[STALL] == pytest.approx(0.0075)
    assert recorder.collect()[STALL] == pytest.approx(0.0075)  # cumulative: nothing new, nothing added


def test_a_copy_the_device_is_not_past_counts_at_the_collect_that_sees_it_done():
    """train.step_sync=compute: a copy may run on past its step's end; reading its events then would wait for
    the device, so the pair stays until a later collect finds it done, and counts once."""
    device = FakeDevice()
    recorder = StallRecorder(device)
    with recorder.copy_on(device.new_stream(), D2H_BUSY):
        device.sleep_us(40)
    end = device.timing_events[-1]
    end.pending = True
    assert recorder.collect()[D2H_BUSY] == 0
    end.pending = False
    assert recorder.collect()[D2H_BUSY] == pytest.approx(40e-6)
    assert recorder.collect()[D2H_BUSY] == pytest.approx(40e-6)


def test_no_stall_when_compute_never_waits():
    device = FakeDevice()
    recorder = StallRecorder(device)
    with recorder.copy_on(device.new_stream(), D2H_BUSY):
        device.sleep_us(40)
    totals = recorder.collect()
    assert totals[STALL] == 0 and totals[D2H_BUSY] == pytest.approx(40e-6)


def test_reload_waits_count_as_stall_and_copies_as_busy_time():
    mover, runtime, device = mover_with_states(copy_delay_us=300)
    slots = list(runtime.slots.values())
    mover.offload(slots)
    for slot in slots:
        mover.reload(slot)
    device.clock.wait_ms = 1.0
    mover.wait_reloaded(slots)
    totals = mover.timer.collect()
    assert totals[STALL] == pytest.approx(len(slots) * 1e-3)
    assert totals[D2H_BUSY] == pytest.approx(len(slots) * 300e-6)
    assert totals[H2D_BUSY] == pytest.approx(len(slots) * 300e-6)


@pytest.mark.parametrize("split", [True, False])
def test_copy_delay_sleeps_on_the_copy_stream_before_every_copy(split):
    mover, runtime, device = mover_with_states(copy_delay_us=200, split=split)
    slots = list(runtime.slots.values())
    mover.offload(slots)
    for slot in slots:
        mover.reload(slot)
    sleeps = [entry for entry in device.log if entry[0] == "sleep_us"]
    assert len(sleeps) == 2 * len(slots)
    copy_streams = {mover.d2h.name, mover.h2d.name}
    assert all(stream in copy_streams and us == 200 for _, stream, us in sleeps)


def test_no_sleep_without_a_copy_delay():
    mover, runtime, device = mover_with_states()
    mover.offload(runtime.slots.values())
    assert not any(entry[0] == "sleep_us" for entry in device.log)


def test_held_release_wait_is_a_stall():
    device = FakeDevice()
    mover = StateMover(device, hold=True)
    runtime = OffloadRuntime(mover, "async", EmptyCachePolicy("never", device.empty_cache))
    runtime.adopt(discover_tasks(FakeZero3Optimizer()))
    slot = next(iter(runtime.slots.values()))
    mover.offload([slot])
    device.clock.wait_ms = 4.0
    assert mover.release(slot)
    assert mover.timer.collect()[STALL] == pytest.approx(0.004)


def test_blocking_mode_host_waits_count_as_stall(monkeypatch):
    mover, runtime, device = mover_with_states()
    clock = iter([10.0, 10.25])
    monkeypatch.setattr("harness.offload.stalls.time.perf_counter", lambda: next(clock))
    mover.synchronize()
    assert mover.timer.collect()[STALL] == pytest.approx(0.25)


def test_the_launch_op_reads_the_allocator_at_forward_start():
    mover, runtime, device = mover_with_states()
    ops.bind_runtime(runtime)
    try:
        device.allocated = 1000
        ops.op(ops.LAUNCH)(torch.zeros(1), ops.REGISTRY.add(ops.LAUNCH, ()))
        device.allocated = 1500
        ops.op(ops.END_BACKWARD)(torch.zeros(1), ops.REGISTRY.add(ops.END_BACKWARD))
        assert runtime.take_readings() == {"fwd_start_allocated_bytes": 1000}
        assert runtime.take_readings() == {}  # a step whose ops did not run reports nothing
    finally:
        ops.bind_runtime(None)
