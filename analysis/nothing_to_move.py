"""Where our pass's time goes when it has nothing to move: per design point of our pass that planned 0 bytes and of
DeepCompile without offload at the same workload (device size included), the measured step time with its interval,
ours over DeepCompile at each device size, and what could make up the difference: allocator retries and the copy
streams' stalls per measured step, Dynamo's graphs, graph breaks and later compiles (summary.json's wall split),
and the profiled step's host time in synchronisations, the allocator, our ops and eager ATen calls beside the
device's busy time (torch_trace.json, harness/contract/profiled_step.py). Table `nothing_to_move`, made only where
such a point profiled a step (`debug.profile_step`; experiments/nothing_to_move.yaml).
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from analysis.columns import PROFILED_COLUMNS
from analysis.design import design, format_value, is_missing
from analysis.measurement import step_interval_text, steps_by_design_point
from analysis.tables import NOT_APPLICABLE, WORKLOAD_COLUMNS, Table, display_frame, format_number
from analysis.wall_split import COMPILE_COLUMNS
from harness.arms import BenchRole, arm_names
from harness.contract import stats

DEVICE = "device_memory_gb"
PLANNED = "planned_offload_bytes"
SPAN = PROFILED_COLUMNS["span_s"]
# The profiled step's parts: (title, seconds column, calls column or None).
PROFILED_PARTS = (("span", "span_s", None), ("device busy", "device_busy_s", None), ("syncs", "sync_s", "syncs"),
                  ("allocator", "allocator_s", "allocator_calls"), ("our ops", "our_ops_s", "our_ops"),
                  ("eager ops", "eager_ops_s", "eager_ops"))
COMPILE_TITLES = {"compiled_graphs": "graphs", "graph_breaks": "graph breaks", "later_compiles": "later compiles"}


def _ours() -> list[str]:
    return arm_names(lambda arm: arm.bench_role == BenchRole.OURS)


def _references() -> list[str]:
    return arm_names(lambda arm: arm.bench_role == BenchRole.REFERENCE)


def compared_points(points: pd.DataFrame) -> pd.DataFrame:
    """Our pass's points that planned nothing to move, and the reference arm's (DeepCompile without offload)."""
    if points.empty or PLANNED not in points:
        return points.iloc[0:0]
    nothing = points["arm"].isin(_ours()) & (points[PLANNED] == 0)
    return points[nothing | points["arm"].isin(_references())]


def has_nothing_to_move(points: pd.DataFrame) -> bool:
    """Whether a point of ours that moved nothing, or its reference, profiled a step beside the other arm."""
    compared = compared_points(points)
    return SPAN in compared and compared[SPAN].notna().any() and compared["arm"].isin(_ours()).any() \
        and compared["arm"].isin(_references()).any()


def _median(values: Sequence[Any]) -> float | None:
    present = [float(value) for value in values if not is_missing(value)]
    return statistics.median(present) if present else None


def _pooled_median(runs: Sequence[pd.DataFrame], column: str) -> float | None:
    """The median of a step column over every measured step of the runs."""
    return _median([value for run in runs if column in run for value in run[column]])


def _calls_per_run(runs: Sequence[pd.DataFrame], column: str) -> float | None:
    """The median over runs of a counter's sum over each run's measured steps (None where no run counted it)."""
    return _median([run[column].sum() for run in runs if column in run and run[column].notna().any()])


def _point_values(row: Mapping[str, Any], group: pd.DataFrame, runs: Sequence[pd.DataFrame]) -> dict[str, Any]:
    times = _step_times(runs)
    interval = stats.runs_interval(times)
    values = {"arm": row["arm"], DEVICE: row.get(DEVICE), "n_runs": len(group), "n_ok": len(runs),
              "step_time_s": stats.median_of_runs(times) if times else None,
              "ci95_low": interval and interval[0], "ci95_high": interval and interval[1],
              "retries_per_step": _pooled_median(runs, "alloc_retries"),
              "copy_stall_s": _pooled_median(runs, "offload_stall_s"),
              "empty_cache_calls": _calls_per_run(runs, "empty_cache_calls")}
    values.update({column: _median(group[column]) if column in group else None for column in COMPILE_COLUMNS})
    values.update({column: _median(group[column]) if column in group else None
                   for column in PROFILED_COLUMNS.values()})
    return values


def _ratio(point: tuple[dict, list], bases: Sequence[tuple[dict, list]], shared: Sequence[str]) -> stats.Ratio | None:
    """Ours over the reference point of the same workload and device size."""
    row, times = point
    for base, base_times in bases:
        if all(format_value(row.get(column)) == format_value(base.get(column)) for column in shared):
            return stats.ratio_interval(times, base_times)
    return None


def _ms(seconds: Any) -> str:
    return NOT_APPLICABLE if is_missing(seconds) else format_number(seconds * 1e3)


def _device_cell(size: Any) -> str:
    return "real" if is_missing(size) else f"{format_value(size)} GB (emulated)"


def _cells(values: Mapping[str, Any], label: str, ratio: stats.Ratio | None) -> dict[tuple[str, str], str]:
    interval = None if values["ci95_low"] is None else (values["ci95_low"], values["ci95_high"])
    cells = {("", "arm"): label, ("", "device"): _device_cell(values[DEVICE]),
             ("", "runs"): f"{values['n_ok']}/{values['n_runs']} ok",
             ("", "s/step"): format_number(values["step_time_s"]),
             ("", "95% interval"): step_interval_text(interval),
             ("", "× deepcompile"): NOT_APPLICABLE if ratio is None
             else stats.ratio_text(ratio.ratio, ratio.low, ratio.high),
             ("per step", "retries"): format_number(values["retries_per_step"]),
             ("per step", "copy stall (ms)"): _ms(values["copy_stall_s"]),
             ("per run", "empty_cache calls"): format_number(values["empty_cache_calls"])}
    cells.update({("compiles", title): format_number(values[column]) for column, title in COMPILE_TITLES.items()})
    for title, seconds, calls in PROFILED_PARTS:
        cell = _ms(values[PROFILED_COLUMNS[seconds]])
        if calls is not None and not is_missing(values[PROFILED_COLUMNS[calls]]):
            cell += f" ({values[PROFILED_COLUMNS[calls]]:.0f})"
        cells[("profiled step (ms)", title)] = cell
    return cells


CAPTION = ("Our pass where it planned nothing to move against DeepCompile without offload, per device size "
           "(emulated by env.device_memory_gb, or the real card): the median over runs of each run's median step time "
           "with its 95% interval, and ours over DeepCompile at the same workload and device size with its interval; "
           "per measured step, the median allocator retries and copy-stream stall, and our pass's empty_cache calls "
           "over a run's measured steps; Dynamo's graphs and graph breaks "
           "over the run and its frames compiled after the final phase's compile step (recompiles); the profiled "
           "step (debug.profile_step, not a measured step), median over runs: its span, the device's busy time, and "
           "host time (calls) in device synchronisations, the allocator (cudaMalloc/cudaFree and expandable "
           "segments' mappings), our custom ops and ATen calls outside compiled code.")


def _step_times(runs: Sequence[pd.DataFrame]) -> list[list[float]]:
    return [run["step_time_s"].astype(float).tolist() for run in runs]


def nothing_to_move_table(points: pd.DataFrame, steps: pd.DataFrame) -> Table:
    """One row per design point of the compared points, in the tables' order; ours carries its ratio."""
    compared = compared_points(points)
    points_design = design(compared)
    by_point = steps_by_design_point(compared, steps)
    shared = [column for column in WORKLOAD_COLUMNS if column in compared]
    bases = [(row, _step_times(runs)) for row, _, _, runs in by_point if row["arm"] in _references()]
    ratios = [_ratio((row, _step_times(runs)), bases, shared) if row["arm"] in _ours() else None
              for row, _, _, runs in by_point]
    values = [_point_values(row, group, runs) for row, _, group, runs in by_point]
    return Table("nothing_to_move",
                 pd.DataFrame([{**point, "ratio": ratio and ratio.ratio, "ratio_low": ratio and ratio.low,
                                "ratio_high": ratio and ratio.high} for point, ratio in zip(values, ratios)]),
                 display_frame([_cells(point, points_design.label(row, leave_out=[DEVICE]), ratio)
                                for point, (row, *_), ratio in zip(values, by_point, ratios)]),
                 caption=CAPTION)
