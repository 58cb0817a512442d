"""A point's wall split as rank 0 records it (harness/rank/wall_split.py): start-up marks, each phase's first step
read from cumulative timers (null where a timer was never started, a measured 0 where it did not move), and our
pass's own seconds."""
from __future__ import annotations

import itertools

from harness.offload import schedule
from harness.rank import wall_split
from harness.rank.wall_split import WallSplit


def test_each_phases_first_step_is_the_growth_of_the_timers_and_a_timer_never_started_stays_null(monkeypatch):
    dynamo, inductor = [], []
    records = {"dynamo_s": None, "lazy_backward_s": None, "inductor_s": None}
    monkeypatch.setattr(wall_split, "torch_timer_records", lambda: dict(records))
    monkeypatch.setattr(wall_split, "cache_counters", lambda: {"fx_graph_cache_hit": 4})
    passes = iter([0.0, 20.0, 20.0, 50.0])
    monkeypatch.setattr(wall_split, "dc_pass_seconds", lambda: next(passes))
    profiling = iter([{}, {0: 15.0}, {0: 15.0}, {0: 15.0, 1: 25.0}])
    ours = iter([None, None, None, 2.5])
    split = WallSplit(profiling_seconds=lambda: next(profiling), pass_seconds=lambda: next(ours))
    compiles = {0: [(dynamo, 18.0), (dynamo, 12.0), (inductor, 12.0)], 2: [(dynamo, 40.5)]}  # by step
    for step, (phase, phase_step) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        split.before_step(phase_step)
        for timer, seconds in compiles.get(step, []):  # torch appends each compile's seconds to a timer's list
            timer.append(seconds)
        records.update(dynamo_s=dynamo or None, inductor_s=inductor or None)
        split.after_step(phase, phase_step, step_time_s=1.0 + step)
    first, second = split.facts()["first_steps"]
    assert (first["dynamo_s"], first["inductor_s"], first["lazy_backward_s"]) == (30.0, 12.0, None)
    assert (first["dc_passes_s"], first["dc_profiling_s"], first["pass_s"]) == (20.0, 15.0, None)
    assert (second["dynamo_s"], second["inductor_s"]) == (40.5, 0.0)
    assert (second["dc_profiling_s"], second["pass_s"]) == (25.0, 2.5)
    assert (first["phase"], first["step_time_s"], second["phase"], second["step_time_s"]) == (0, 1.0, 1, 3.0)
    assert second["fx_graph_cache_hit"] == 0  # the counter did not move in that step


def test_dynamos_reset_inside_a_phases_first_step_leaves_that_steps_own_compile_seconds_not_a_negative_total():
    """DeepCompile resets Dynamo at its switch to the next phase, which empties torch's records: measured on a GPU,
    the difference of totals read -2.3 s for a compile of about 17 s."""
    before = {"dynamo_s": [20.0, 8.8], "lazy_backward_s": [3.0], "inductor_s": None}
    marks = wall_split.mark_timers(before)
    after_reset = {"dynamo_s": [17.4], "lazy_backward_s": None, "inductor_s": [14.3]}  # new lists
    growth = {name: wall_split.timer_growth(marks[name], now) for name, now in after_reset.items()}
    assert growth == {"dynamo_s": 17.4, "lazy_backward_s": 0.0, "inductor_s": 14.3}
    before["dynamo_s"].append(5.0)  # no reset: the same list grew
    assert wall_split.timer_growth(marks["dynamo_s"], before["dynamo_s"]) == 5.0
    assert wall_split.timer_growth(marks["inductor_s"], None) is None  # never started


def test_a_torch_without_compile_records_reads_null_timers(monkeypatch):
    monkeypatch.setattr(wall_split, "torch_timer_records", lambda: None)
    split = WallSplit()
    split.before_step(0)
    split.after_step(0, 0, 0.5)
    step = split.facts()["first_steps"][0]
    assert (step["dynamo_s"], step["lazy_backward_s"], step["inductor_s"]) == (None, None, None)


def test_the_real_torch_keeps_its_compile_records_where_the_split_reads_them():
    """The names move between torch releases: this torch has the dict, and reset empties it (why marks hold lists)."""
    import torch._dynamo
    from torch._dynamo import utils

    records = wall_split.torch_timer_records()
    assert records is not None and set(records) == set(wall_split.TORCH_TIMERS)
    utils.compilation_time_metrics.setdefault(wall_split.TORCH_TIMERS["dynamo_s"], []).append(1.0)
    marks = wall_split.mark_timers(wall_split.torch_timer_records())
    torch._dynamo.reset()
    assert wall_split.timer_growth(marks["dynamo_s"], wall_split.torch_timer_records()["dynamo_s"]) == 0.0


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


def test_dynamos_counters_say_what_a_phases_first_step_compiled_and_what_later_steps_compiled_again():
    """On this torch, for real: a graph break in the compile step, then a recompile (a new rank of input) in a later
    step, which is what the later_compiles block exists to catch; Dynamo's reset between them loses no count."""
    import torch
    import torch._dynamo

    def with_a_break(x):
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1

    compiled = torch.compile(with_a_break, backend="eager")
    split = WallSplit()
    inputs = {0: torch.ones(3), 1: torch.ones(3), 2: torch.ones(3), 3: torch.ones(2, 2)}  # step 3: a new rank
    for step, (phase, phase_step) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        split.before_step(phase_step)
        if step == 2:
            torch._dynamo.reset()  # as DeepCompile does at its switch to the next phase: the next call compiles
        compiled(inputs[step])
        split.after_step(phase, phase_step, step_time_s=1.0)
    facts = split.facts()
    first, second = facts["first_steps"]
    assert first["graph_breaks"] >= 1 and first["graphs"] >= 2 and first["frames"] >= 2  # the frame and its resume
    assert second["graph_breaks"] >= 1 and second["frames"] >= 2  # compiled again after the reset
    assert facts["later_compiles"]["frames"] >= 1 and facts["later_compiles"]["graphs"] >= 1


def test_the_compile_totals_count_a_recompile_between_the_phases_first_steps():
    """A recompile in phase 0's second step is in neither a first step's growth nor the last phase's later ones."""
    import torch

    compiled = torch.compile(lambda x: x * 2, backend="eager")
    split = WallSplit()
    inputs = [torch.ones(3), torch.ones(2, 2), torch.ones(3)]  # phase 0's second step: a new rank, a recompile
    before = wall_split.compile_counters()["frames"]
    for step, (phase, phase_step) in enumerate([(0, 0), (0, 1), (1, 0)]):
        split.before_step(phase_step)
        compiled(inputs[step])
        split.after_step(phase, phase_step, step_time_s=1.0)
    facts = split.facts()
    by_steps = sum(step["frames"] for step in facts["first_steps"]) + facts["later_compiles"]["frames"]
    assert facts["compile_totals"]["frames"] - before == by_steps + 1


def test_the_compile_counters_stay_null_until_a_phase_has_had_its_first_step():
    split = WallSplit()
    assert split.facts()["later_compiles"] is None
    split.before_step(0)
    split.after_step(0, 0, 0.5)
    assert split.facts()["later_compiles"] == {"graphs": 0, "frames": 0, "graph_breaks": 0}
