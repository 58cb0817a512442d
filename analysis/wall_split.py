"""One run's wall split (summary.json's `wall_split` and `profile_cache`, harness/rank/wall_split.py) as point
columns: the phases' first steps in their parts, the start-up's parts, teardown, and the profiles reused. Every
column is null in runs recorded before the split, and a part is null where the run's torch or DeepSpeed did not
time it (never a 0 it did not measure)."""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from harness.contract.checks import is_finite_number
from harness.contract.runfiles import digest

# Of the phases' first steps, summed over phases: Dynamo and AOT tracing (torch's compile time less what is nested
# in it), inductor, DeepCompile's profiling runs (also per phase, as JSON), its other pass work, our pass's.
FIRST_STEP_COLUMNS = ("split_trace_s", "split_inductor_s", "split_dc_profiling_s", "split_dc_other_s",
                      "split_pass_s")
# Of the rest: imports and the process group, the model under zero.Init, the engine and compile set-up, and
# torchrun with the run's end (the driver's wall time less the worker process's, plus the worker's after its steps).
REST_COLUMNS = ("split_imports_s", "split_model_s", "split_engine_s", "split_teardown_s")
# Dynamo's counters (harness/rank/wall_split.py's compile_counters), in runs that recorded them only: graphs
# compiled and graph breaks over the whole process (compile_totals), and frames converted after the last phase's
# first step (recompiles).
COMPILED_GRAPHS, GRAPH_BREAKS, LATER_COMPILES = "compiled_graphs", "graph_breaks", "later_compiles"
COMPILE_COLUMNS = (COMPILED_GRAPHS, GRAPH_BREAKS, LATER_COMPILES)
SPLIT_COLUMNS = (*FIRST_STEP_COLUMNS, *REST_COLUMNS, "split_dc_profiling_by_phase", "profile_key", "profiles_reused",
                 "profiles_looked_up", "profiled_graphs")


def _number(block: Mapping[str, Any], name: str) -> float | None:
    value = block.get(name)
    return float(value) if is_finite_number(value) and not isinstance(value, bool) else None


def _total(parts: Sequence[float | None]) -> float | None:
    """A sum of parts, null if any part is (or there is none)."""
    return float(sum(parts)) if parts and all(part is not None for part in parts) else None


def _trace(step: Mapping[str, Any]) -> float | None:
    """Dynamo and AOT tracing: torch's frame compiles plus its lazy backward compiles (none timed: none made),
    less inductor and DeepCompile's passes nested in them."""
    dynamo, inductor, passes = (_number(step, name) for name in ("dynamo_s", "inductor_s", "dc_passes_s"))
    if dynamo is None or inductor is None or passes is None:
        return None
    return dynamo + (_number(step, "lazy_backward_s") or 0.0) - inductor - passes


def _dc_other(step: Mapping[str, Any]) -> float | None:
    passes, profiling = _number(step, "dc_passes_s"), _number(step, "dc_profiling_s")
    if passes is None or profiling is None:
        return None
    return passes - profiling - (_number(step, "pass_s") or 0.0)


def first_step_columns(first_steps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    by_phase = [_number(step, "dc_profiling_s") for step in first_steps]
    return {"split_trace_s": _total([_trace(step) for step in first_steps]),
            "split_inductor_s": _total([_number(step, "inductor_s") for step in first_steps]),
            "split_dc_profiling_s": _total(by_phase),
            "split_dc_other_s": _total([_dc_other(step) for step in first_steps]),
            "split_pass_s": _total([_number(step, "pass_s") for step in first_steps]),
            "split_dc_profiling_by_phase": json.dumps(by_phase) if any(v is not None for v in by_phase) else None}


def rest_columns(split: Mapping[str, Any], wall_time_s: Any) -> dict[str, Any]:
    imports, group = _number(split, "imports_s"), _number(split, "process_group_s")
    after, process = _number(split, "after_steps_s"), _number(split, "process_s")
    wall = float(wall_time_s) if is_finite_number(wall_time_s) else None
    teardown = after + wall - process if None not in (after, process, wall) else None
    return {"split_imports_s": _total([imports, group]), "split_model_s": _number(split, "model_s"),
            "split_engine_s": _number(split, "engine_s"), "split_teardown_s": teardown}


def cache_columns(cache: Any) -> dict[str, Any]:
    """The profile cache's key and its lookups over all phases (null: no cache, reuse off or a single run)."""
    if not isinstance(cache, Mapping):
        return {"profile_key": None, "profiles_reused": None, "profiles_looked_up": None, "profiled_graphs": None}
    lookups = [counts for counts in (cache.get("lookups") or {}).values() if isinstance(counts, Mapping)]
    hits = sum(int(counts.get("hit") or 0) for counts in lookups)
    graphs = cache.get("graphs")  # absent in runs recorded before it
    return {"profile_key": cache.get("key"), "profiles_reused": hits,
            "profiles_looked_up": hits + sum(int(counts.get("miss") or 0) for counts in lookups),
            "profiled_graphs": digest(graphs) if isinstance(graphs, Mapping) and graphs else None}


def split_columns(summary: Mapping[str, Any]) -> dict[str, Any]:
    """SPLIT_COLUMNS of one summary."""
    split = summary.get("wall_split")
    columns = dict.fromkeys(SPLIT_COLUMNS)
    if isinstance(split, Mapping):
        first_steps = [step for step in split.get("first_steps") or [] if isinstance(step, Mapping)]
        columns.update(first_step_columns(first_steps), **rest_columns(split, summary.get("wall_time_s")))
    columns.update(cache_columns(summary.get("profile_cache")))
    return columns


def compile_columns(summary: Mapping[str, Any]) -> dict[str, Any]:
    """COMPILE_COLUMNS of one summary; none at all for a run recorded before the split counted compiles (its
    frame then stays as it was)."""
    split = summary.get("wall_split")
    later = split.get("later_compiles") if isinstance(split, Mapping) else None
    totals = split.get("compile_totals") if isinstance(split, Mapping) else None
    if not isinstance(later, Mapping) or not isinstance(totals, Mapping):
        return {}
    return {COMPILED_GRAPHS: _number(totals, "graphs"), GRAPH_BREAKS: _number(totals, "graph_breaks"),
            LATER_COMPILES: _number(later, "frames")}
