"""Where a point's wall time goes, as rank 0 measures it (worker.json's `wall_split`, copied into summary.json).

- start-up, in marks since the process began: imports (Python, torch), the process group (and DeepSpeed's import),
  the model under zero.Init, the engine (deepspeed.initialize and the arm's compile set-up);
- each phase's first step (`first_steps`, one entry per phase), cumulative timers read before and after it:
  - `dynamo_s`: torch's Dynamo frame compiles (`_compile.compile_inner`), everything nested in them included
    (AOT tracing, DeepCompile's forward passes, inductor); `lazy_backward_s`: backward graphs compiled at their
    first backward (`backward._backward_impl`), which Dynamo's timer does not cover;
  - `inductor_s`: inductor's compile of each graph (`compile_fx_inner`: code generation, Triton and C++ builds);
  - `dc_passes_s`: DeepCompile's passes (deepspeed.compile.backend.opt_pass_times), its profiling runs included;
  - `dc_profiling_s`: of them, DeepCompile's profiling runs (profile_cache wraps its two interpreters);
  - `pass_s`: of them, our pass's evict, snapshot and plan (the offload arm only);
  - the FX graph cache's hits, misses and bypasses, the AOTAutograd cache's hits and misses (torch's counters);
  - Dynamo's compile counters (`compile_counters`): graphs made, frames converted (a recompile converts its frame
    again) and graph breaks, which Dynamo's reset leaves as they were;
  a torch timer this torch does not have (names move between releases) stays null, as does one never started in
  the process so far; one that ran before but not in this step is a measured 0. Dynamo's reset (DeepCompile calls
  it at its schedule's switch to the next phase) clears torch's records mid-run, so a step's share is read from the
  records themselves (`timer_growth`), never as a difference of totals, which went negative across the reset;
- `later_compiles`: the compile counters' growth after the last phase's first step (its warm-up, measured and
  debug steps), where a recompile or a new graph break is paid in measured time (null before that first step);
  `compile_totals`: the counters over the whole process, steps between the phases' first steps included;
- after the steps: the machine readings up to writing worker.json (`after_steps_s`), and the process's
  whole life (`process_s`), so that the driver's wall time less it is torchrun's own start and end.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import psutil

TORCH_TIMERS = {"dynamo_s": "_compile.compile_inner", "lazy_backward_s": "backward._backward_impl",
                "inductor_s": "compile_fx_inner"}
CACHE_COUNTERS = {"fx_graph_cache_hit": ("inductor", "fxgraph_cache_hit"),
                  "fx_graph_cache_miss": ("inductor", "fxgraph_cache_miss"),
                  "fx_graph_cache_bypass": ("inductor", "fxgraph_cache_bypass"),  # a graph inductor would not key
                  "autograd_cache_hit": ("aot_autograd", "autograd_cache_hit"),
                  "autograd_cache_miss": ("aot_autograd", "autograd_cache_miss")}
# Dynamo's counters (torch._dynamo.utils.counters, group and key); tests/test_wall_split.py checks them on its torch.
COMPILE_COUNTERS = {"graphs": ("stats", "unique_graphs"), "frames": ("frames", "total")}
GRAPH_BREAKS = "graph_break"  # a group of its own: one count per break reason
STARTUP_MARKS = ("imports_s", "process_group_s", "model_s", "engine_s")  # in the order the worker reaches them


def seconds_since_process_start() -> float:
    return time.time() - psutil.Process().create_time()


@dataclass(frozen=True)
class TimerMark:
    """Where one of torch's compile timers stood: its live list of per-call seconds (None: never started so far)
    and how many it held. Dynamo's reset empties the dict that holds these lists, and the next call starts a new
    list, so the same list object means no reset since the mark."""
    records: list[float] | None
    count: int


def torch_timer_records() -> dict[str, list[float] | None] | None:
    """Torch's compile timers' live lists of per-call seconds by our name (a name's list None: never started so
    far, or cleared since); None where this torch keeps no such records."""
    try:
        from torch._dynamo import utils
    except ImportError:
        return None
    metrics = getattr(utils, "compilation_time_metrics", None)
    if metrics is None:
        return None
    return {name: metrics.get(key) for name, key in TORCH_TIMERS.items()}


def mark_timers(records: dict[str, list[float] | None] | None) -> dict[str, TimerMark] | None:
    """Each timer's mark now (None where this torch keeps no records)."""
    if records is None:
        return None
    return {name: TimerMark(values, len(values or ())) for name, values in records.items()}


def timer_growth(mark: TimerMark | None, now: list[float] | None) -> float | None:
    """Seconds a timer gained since its mark: the records added to the same list, or, where Dynamo's reset
    replaced the list meanwhile, every record of the new one (the reset comes before the phase's compile). A timer
    that ran before but not since reads 0; one never started stays None."""
    if now is None:
        return 0.0 if mark is not None and mark.records else None
    if mark is not None and now is mark.records:
        return round(sum(now[mark.count:]), 3)
    return round(sum(now), 3)


def cache_counters() -> dict[str, int | None]:
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return dict.fromkeys(CACHE_COUNTERS)
    return {name: (int(counters[group][key]) if key in counters.get(group, {}) else None)
            for name, (group, key) in CACHE_COUNTERS.items()}


def compile_counters() -> dict[str, int | None]:
    """Graphs, frames and graph breaks Dynamo has counted in this process (0 before its first compile; None where
    this torch has no counters)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return dict.fromkeys((*COMPILE_COUNTERS, "graph_breaks"))
    read = {name: int(counters.get(group, {}).get(key, 0)) for name, (group, key) in COMPILE_COUNTERS.items()}
    return {**read, "graph_breaks": int(sum(counters.get(GRAPH_BREAKS, {}).values()))}


def dc_pass_seconds() -> float | None:
    """DeepCompile's cumulative pass time (None where this DeepSpeed keeps no opt_pass_times)."""
    try:
        from deepspeed.compile import backend
    except ImportError:
        return None
    times = getattr(backend, "opt_pass_times", None)
    return None if times is None else float(sum(entry[-1] for entry in times))


def _delta(before: float | None, after: float | None) -> float | None:
    """A cumulative reading's growth; a timer first started during the step counts from 0, one never started
    stays None."""
    if after is None:
        return None
    return round(after - (before or 0), 3)


class WallSplit:
    """Rank 0's marks and each phase's first-step readings, for worker.json."""

    def __init__(self, profiling_seconds: Callable[[], dict[int, float]] | None = None,
                 pass_seconds: Callable[[], float | None] = lambda: None):
        self.profiling_seconds = profiling_seconds  # profile_cache.install's reader (None: not compiled)
        self.pass_seconds = pass_seconds
        self.marks: dict[str, float] = {}
        self.first_steps: list[dict[str, Any]] = []
        self._before: dict[str, Any] = {}
        self._timer_marks: dict[str, TimerMark] | None = None
        self._steps_end: float | None = None
        self._after_first_step: dict[str, int | None] | None = None  # the last phase's, at its end

    def mark(self, name: str) -> None:
        """The end of a start-up part (STARTUP_MARKS), as seconds since the process began."""
        self.marks[name] = seconds_since_process_start()

    def _readings(self) -> dict[str, Any]:
        """The cumulative readings other than torch's timers, which `_timers` reads from their records."""
        compiled = self.profiling_seconds is not None  # DeepCompile's numbers only where it compiles
        return {"dc_passes_s": dc_pass_seconds() if compiled else None,
                "dc_profiling_s": sum(self.profiling_seconds().values()) if compiled else None,
                "pass_s": self.pass_seconds(), **cache_counters(), **compile_counters()}

    def before_step(self, phase_step: int) -> None:
        if phase_step == 0:
            self._before = self._readings()
            self._timer_marks = mark_timers(torch_timer_records())

    def _timers(self) -> dict[str, float | None]:
        records = torch_timer_records()
        if records is None:
            return dict.fromkeys(TORCH_TIMERS)
        marks = self._timer_marks or {}
        return {name: timer_growth(marks.get(name), now) for name, now in records.items()}

    def after_step(self, phase: int, phase_step: int, step_time_s: float) -> None:
        self._steps_end = time.perf_counter()
        if phase_step != 0:
            return
        after = self._readings()
        self._after_first_step = {name: after[name] for name in (*COMPILE_COUNTERS, "graph_breaks")}
        self.first_steps.append({"phase": phase, "step_time_s": round(step_time_s, 3), **self._timers(),
                                 **{name: _delta(self._before.get(name), value) for name, value in after.items()}})

    def facts(self) -> dict[str, Any]:
        """worker.json's wall_split, at its last write."""
        startup, previous = {}, 0.0
        for name in STARTUP_MARKS:
            if name in self.marks:
                startup[name] = round(self.marks[name] - previous, 3)
                previous = self.marks[name]
            else:
                startup[name] = None
        after_steps = None if self._steps_end is None else round(time.perf_counter() - self._steps_end, 3)
        later = None if self._after_first_step is None else {
            name: _delta(self._after_first_step[name], value) for name, value in compile_counters().items()}
        return {**startup, "first_steps": self.first_steps, "later_compiles": later,
                "compile_totals": compile_counters(), "after_steps_s": after_steps,
                "process_s": round(seconds_since_process_start(), 3)}
