"""The allocator trace's window (debug.memory_trace_step, debug.memory_trace_steps): one recording from its first
step to its last, every step inside it marked traced (left out of the measured ones), on rank 0 only."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.contract.schema.groups import DebugConfig
from harness.rank import diagnostics


def debug_config(**values) -> DebugConfig:
    base = {"fault": None, "fault_step": 0, "fault_rank": 0, "fault_sleep_s": 1.0, "profile_step": None,
            "memory_trace_step": None, "memory_trace_steps": 1, "copy_delay_us": 0}
    return DebugConfig(**{**base, **values})


@pytest.fixture
def recorder(monkeypatch) -> list[tuple]:
    calls: list[tuple] = []
    monkeypatch.setattr(diagnostics.memory_trace, "start", lambda device: calls.append(("start",)))
    monkeypatch.setattr(diagnostics.memory_trace, "stop_and_write",
                        lambda run_dir, device, steps: calls.append(("stop", steps[0], steps[-1])))
    return calls


def walk(watch: diagnostics.StepDiagnostics, steps: int, calls: list[tuple]) -> list[tuple]:
    """Each step's (step, traced, calls made during it)."""
    seen = []
    for step in range(steps):
        before = len(calls)
        watch.before(step, "cuda:0")
        watch.after(step, "cuda:0", Path("."))
        seen.append((step, watch.traces(step), calls[before:]))
    return seen


def test_a_window_of_three_steps_is_one_recording_and_each_of_its_steps_is_traced(recorder):
    watch = diagnostics.StepDiagnostics(debug_config(memory_trace_step=4, memory_trace_steps=3), rank=0, cuda=True)
    seen = walk(watch, 9, recorder)
    assert [step for step, traced, _ in seen if traced] == [4, 5, 6]
    assert seen[4][2] == [("start",)] and seen[6][2] == [("stop", 4, 6)]
    assert recorder == [("start",), ("stop", 4, 6)]


def test_the_default_window_traces_its_one_step(recorder):
    watch = diagnostics.StepDiagnostics(debug_config(memory_trace_step=2), rank=0, cuda=True)
    seen = walk(watch, 5, recorder)
    assert [step for step, traced, _ in seen if traced] == [2]
    assert seen[2][2] == [("start",), ("stop", 2, 2)]


@pytest.mark.parametrize("rank,cuda", [(1, True), (0, False)])
def test_other_ranks_and_a_cpu_run_trace_nothing(recorder, rank, cuda):
    watch = diagnostics.StepDiagnostics(debug_config(memory_trace_step=1, memory_trace_steps=2), rank=rank, cuda=cuda)
    seen = walk(watch, 4, recorder)
    assert not any(traced for _, traced, _ in seen) and recorder == []
