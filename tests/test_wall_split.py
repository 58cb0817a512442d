"""A point's wall split as rank 0 records it (harness/rank/wall_split.py): start-up marks, each phase's first step
read from cumulative timers (null where a timer was never started, a measured 0 where it did not move), and our
pass's own seconds."""
from __future__ import annotations

import itertools

from harness.offload import schedule
from harness.rank import wall_split
from harness.rank.wall_split import WallSplit


def test_each_phases_first_step_is_the_growth_of_the_timers_and_a_timer_never_started_stays_null(monkeypatch):
    readings = iter([
        {"dynamo_s": None, "lazy_backward_s": None, "inductor_s": None},   # before phase 0's first step
        {"dynamo_s": 30.0, "lazy_backward_s": None, "inductor_s": 12.0},  # after it: two timers started
        {"dynamo_s": 30.0, "lazy_backward_s": None, "inductor_s": 12.0},  # before phase 1's
        {"dynamo_s": 70.5, "lazy_backward_s": None, "inductor_s": 12.0},  # after: inductor did not move
    ])
    monkeypatch.setattr(wall_split, "torch_timers", lambda: next(readings))
    monkeypatch.setattr(wall_split, "cache_counters", lambda: {"fx_graph_cache_hit": 4})
    passes = iter([0.0, 20.0, 20.0, 50.0])
    monkeypatch.setattr(wall_split, "dc_pass_seconds", lambda: next(passes))
    profiling = iter([{}, {0: 15.0}, {0: 15.0}, {0: 15.0, 1: 25.0}])
    ours = iter([None, None, None, 2.5])
    split = WallSplit(profiling_seconds=lambda: next(profiling), pass_seconds=lambda: next(ours))
    for step, (phase, phase_step) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        split.before_step(phase_step)
        split.after_step(phase, phase_step, step_time_s=1.0 + step)
    first, second = split.facts()["first_steps"]
    assert (first["dynamo_s"], first["inductor_s"], first["lazy_backward_s"]) == (30.0, 12.0, None)
    assert (first["dc_passes_s"], first["dc_profiling_s"], first["pass_s"]) == (20.0, 15.0, None)
    assert (second["dynamo_s"], second["inductor_s"]) == (40.5, 0.0)
    assert (second["dc_profiling_s"], second["pass_s"]) == (25.0, 2.5)
    assert (first["phase"], first["step_time_s"], second["phase"], second["step_time_s"]) == (0, 1.0, 1, 3.0)
    assert second["fx_graph_cache_hit"] == 0  # the counter did not move in that step


def test_an_eager_arm_records_no_deepcompile_numbers_and_start_up_in_parts(monkeypatch):
    clock = itertools.count(start=2.0, step=1.5)
    monkeypatch.setattr(wall_split, "seconds_since_process_start", lambda: next(clock))
    split = WallSplit()
    for name in ("imports_s", "process_group_s", "engine_s"):  # no model mark: that part reads null
        split.mark(name)
    split.before_step(0)
    split.after_step(0, 0, 0.5)
    facts = split.facts()
    assert (facts["imports_s"], facts["process_group_s"], facts["model_s"], facts["engine_s"]) == (2.0, 1.5, None, 1.5)
    assert facts["first_steps"][0]["dc_passes_s"] is None and facts["first_steps"][0]["dc_profiling_s"] is None
    assert facts["process_s"] == 6.5 and facts["after_steps_s"] >= 0


def test_our_passes_add_up_their_seconds():
    class Pass:
        pass_seconds = 0.0

    offload_pass = Pass()
    timed = schedule._timed(offload_pass, lambda *args: sum(args))
    assert timed(1, 2) == 3 and timed(3) == 3
    assert offload_pass.pass_seconds > 0
