"""Per-phase statistics: what the medians count."""
from __future__ import annotations

import pytest
import torch

from harness.contract.steps import summarize_phases
from harness.rank.host_memory import HostMemoryMonitor
from harness.rank.monitor import SEGMENTS, MemoryMonitor


def row(step, phase_step, time, traced=False, reserved=10):
    return {"step": step, "phase": 0, "phase_step": phase_step, "step_time_s": time, "traced": traced,
            "peak_reserved_bytes": reserved}


def test_compile_step_and_traced_steps_are_left_out_of_the_time_statistics():
    rows = [row(0, 0, 60.0), row(1, 1, 1.0), row(2, 2, 9.0, traced=True, reserved=99), row(3, 3, 3.0)]
    (phase,) = summarize_phases(rows)
    assert phase["compile_time_s"] == 60.0
    assert phase["n"] == 2 and phase["step_time_s"]["median"] == 2.0
    assert phase["peak_reserved_bytes"]["max"] == 99  # memory peaks still count every step


def test_rows_without_the_traced_field_count_as_untraced():
    rows = [row(0, 0, 60.0), {"step": 1, "phase": 0, "phase_step": 1, "step_time_s": 4.0}]
    assert summarize_phases(rows)[0]["step_time_s"]["median"] == 4.0


class FakeAllocator:
    """torch.cuda's peak statistics as the monitor reads them: peaks since the last reset."""

    def __init__(self):
        self.allocated = self.reserved = 0
        self.peak_allocated = self.peak_reserved = 0

    def hold(self, allocated, reserved):
        self.allocated, self.reserved = allocated, reserved
        self.peak_allocated = max(self.peak_allocated, allocated)
        self.peak_reserved = max(self.peak_reserved, reserved)

    def memory_stats(self, device=None):
        return {"allocated_bytes.all.peak": self.peak_allocated, "reserved_bytes.all.peak": self.peak_reserved,
                "num_alloc_retries": 0, "num_ooms": 0}

    def reset_peak_memory_stats(self, device=None):
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved


def cuda_monitor(monkeypatch) -> tuple[MemoryMonitor, FakeAllocator]:
    allocator = FakeAllocator()
    monkeypatch.setattr(torch.cuda, "memory_stats", allocator.memory_stats)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", allocator.reset_peak_memory_stats)
    monitor = MemoryMonitor(torch.device("cpu"))
    monitor.cuda = True  # the allocator is the fake one
    return monitor, allocator


def test_the_monitor_splits_the_step_peak_into_forward_backward_and_optimizer_step(monkeypatch):
    monitor, allocator = cuda_monitor(monkeypatch)
    allocator.hold(50, 60)  # the last step's leftovers: a reset starts from what is held now
    monitor.reset_peaks()
    for fwd_bwd_peak, opt_peak in ((90, 70), (80, 95)):  # two micro-batches (gradient accumulation)
        allocator.hold(fwd_bwd_peak, 100)
        allocator.hold(40, 100)
        monitor.end_segment("fwd_bwd")
        allocator.hold(opt_peak, 120)
        allocator.hold(40, 120)
        monitor.end_segment("opt_step")
    allocator.hold(45, 120)  # after the last segment
    stats = monitor.step_stats()
    assert stats["fwd_bwd_peak_allocated_bytes"] == 90
    assert stats["opt_step_peak_allocated_bytes"] == 95
    assert stats["peak_allocated_bytes"] == 95 and stats["peak_reserved_bytes"] == 120
    monitor.reset_peaks()
    allocator.hold(47, 120)
    stats = monitor.step_stats()  # a step whose segments were not closed reports no segment peaks
    assert stats["peak_allocated_bytes"] == 47
    assert stats["fwd_bwd_peak_allocated_bytes"] is None and stats["opt_step_peak_allocated_bytes"] is None


def test_segment_peaks_have_steady_per_phase_maxima_and_a_cpu_monitor_reports_none():
    rows = [{**row(0, 0, 60.0), "fwd_bwd_peak_allocated_bytes": 5, "opt_step_peak_allocated_bytes": 7},
            {**row(1, 1, 1.0), "fwd_bwd_peak_allocated_bytes": 6, "opt_step_peak_allocated_bytes": None}]
    (phase,) = summarize_phases(rows)
    # the compile step's peaks are the compiler's: steady maxima leave it out
    assert phase["fwd_bwd_peak_allocated_bytes"]["steady_max"] == 6
    assert phase["opt_step_peak_allocated_bytes"]["steady_max"] is None
    stats = MemoryMonitor(torch.device("cpu")).step_stats()
    assert all(stats[f"{segment}_peak_allocated_bytes"] is None for segment in SEGMENTS)


class FakePinnedAllocator:
    """torch.cuda.host_memory_stats as the host monitor reads it: running totals since the process started."""

    def __init__(self):
        self.stats: dict | None = None  # nothing pinned yet: torch returns no statistics

    def pin(self, rounded_bytes: int, microseconds: float):
        stats = self.stats or {"allocated_bytes.current": 0, "host_alloc_time.total": 0.0}
        self.stats = {"allocated_bytes.current": stats["allocated_bytes.current"] + rounded_bytes,
                      "host_alloc_time.total": stats["host_alloc_time.total"] + microseconds}

    def __call__(self):
        return None if self.stats is None else dict(self.stats)


def test_the_host_monitor_reports_pinned_bytes_held_and_the_seconds_each_step_spent_pinning():
    allocator = FakePinnedAllocator()
    host = HostMemoryMonitor(cuda=True, pinned_stats=allocator)
    assert host.at_start == {"pinned_host_bytes_at_start": None, "pin_time_s_at_start": None}
    first = host.step_stats()  # a step before anything was pinned
    assert first["pinned_host_bytes"] is None and first["pin_time_s"] is None
    allocator.pin(2**29, 250_000.0)  # the first offload pins two buffers
    allocator.pin(2**29, 250_000.0)
    second = host.step_stats()
    assert second["pinned_host_bytes"] == 2**30 and second["pin_time_s"] == pytest.approx(0.5)
    third = host.step_stats()  # later steps reuse the buffers: held, and no time spent pinning
    assert third["pinned_host_bytes"] == 2**30 and third["pin_time_s"] == 0.0
    assert first["host_rss_bytes"] > 0 and third["host_rss_bytes"] > 0


def test_what_was_pinned_before_the_first_step_is_reported_apart_from_the_steps():
    allocator = FakePinnedAllocator()
    allocator.pin(2**30, 1_500_000.0)  # ZeRO-Offload's buffers, pinned while the engine was built
    host = HostMemoryMonitor(cuda=True, pinned_stats=allocator)
    assert host.at_start == {"pinned_host_bytes_at_start": 2**30, "pin_time_s_at_start": 1.5}
    assert host.step_stats()["pin_time_s"] == 0.0


def test_a_cpu_host_monitor_reads_the_resident_set_and_no_pinned_memory():
    stats = HostMemoryMonitor(cuda=False, pinned_stats=FakePinnedAllocator()).step_stats()
    assert stats["host_rss_bytes"] > 0
    assert stats["pinned_host_bytes"] is None and stats["pin_time_s"] is None


def test_a_torch_that_names_its_statistics_otherwise_reads_as_not_available_not_zero():
    host = HostMemoryMonitor(cuda=True, pinned_stats=lambda: {"some.other.key": 5})
    stats = host.step_stats()
    assert stats["pinned_host_bytes"] is None and stats["pin_time_s"] is None


def test_pinned_bytes_are_what_the_allocator_holds_under_either_torchs_name():
    older = {"reserved_bytes.current": 2**30, "allocated_bytes.current": 2**29, "host_alloc_time.total": 0.0}
    newer = {"allocated_bytes.current": 2**30, "active_bytes.current": 2**29, "host_alloc_time.total": 0.0}
    for stats in (older, newer):  # torch <= 2.8: reserved = held, allocated = in use; later: allocated = held
        host = HostMemoryMonitor(cuda=True, pinned_stats=lambda stats=stats: stats)
        assert host.step_stats()["pinned_host_bytes"] == 2**30
