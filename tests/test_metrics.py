"""Per-phase statistics: what the medians count."""
from __future__ import annotations

import torch

from harness.contract.steps import summarize_phases
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
