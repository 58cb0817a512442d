"""Per-phase statistics: what the medians count."""
from __future__ import annotations

from harness.metrics import summarize_phases


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
