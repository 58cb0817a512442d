"""What the pauses inside a step cost per design point: the allocator's retries (a device synchronize, a flush of
every cached block, a new cudaMalloc), with the slope of step time on retries per step, and where the runs recorded
it, Python's garbage collector (gc_s, train.gc) and the host's wait at each step's end (end_sync_s), which tells a
host-paced step from a device-paced one. analysis/measurement.py's tables say how each point was measured.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
from scipy import stats as scipy_stats

from analysis.measurement import _point_head, _retries, _step_time_cell, _times, steps_by_design_point
from analysis.tables import Table, display_frame, format_number

RETRY_VALUES = ("steps", "steps_recorded", "steps_retried", "retries_median", "fewest_retries", "steps_at_fewest",
                "step_time_s_at_fewest", "step_time_s", "retry_cost_s", "retry_cost_ci95_low", "retry_cost_ci95_high")
RETRY_COUNTS = ("steps", "steps_recorded", "steps_retried", "steps_at_fewest")


def retry_cost(retries: pd.Series, times: pd.Series) -> tuple[float, float, float] | None:
    """Seconds a retry adds to a step with its 95% interval: the Theil-Sen slope of step time on retries per step,
    which a few slow steps do not drag; None where retries do not vary, so no slope can be told."""
    if retries.nunique() < 2:
        return None
    slope, _, low, high = scipy_stats.theilslopes(times.to_numpy(), retries.to_numpy(), alpha=0.95)
    return float(slope), float(low), float(high)


def retry_values(runs: Sequence[pd.DataFrame]) -> dict[str, float | None]:
    """RETRY_VALUES over a design point's measured steps, its runs pooled (what a retry costs is a property of the
    point's steps, not of a run); None where no step was measured, the retry columns None where none recorded one."""
    times = pd.Series([seconds for run in runs for seconds in _times(run)], dtype=float)
    retries = pd.Series([count for run in runs for count in _retries(run)], dtype=float)
    values: dict[str, float | None] = dict.fromkeys(RETRY_VALUES)
    if times.empty:
        return values
    values.update(steps=len(times), step_time_s=float(times.median()))
    recorded = retries.notna()
    if not recorded.any():
        return values
    retries, times = retries[recorded], times[recorded]
    fewest = retries == retries.min()
    cost = retry_cost(retries, times)
    values.update(steps_recorded=len(retries), steps_retried=int((retries > 0).sum()),
                  retries_median=float(retries.median()), fewest_retries=float(retries.min()),
                  steps_at_fewest=int(fewest.sum()), step_time_s_at_fewest=float(times[fewest].median()))
    if cost is not None:
        values.update(retry_cost_s=cost[0], retry_cost_ci95_low=cost[1], retry_cost_ci95_high=cost[2])
    return values


def _ms(seconds: float) -> str:
    return format_number(seconds * 1000)


def _retry_cells(values: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    """The cells that need recorded retries (none, so "-", where no measured step recorded them), and the cost per
    retry only where retries varied."""
    if values["steps_recorded"] is None:
        return {}
    at_fewest = values["steps_at_fewest"]
    cells = {("", "retried"): f"{values['steps_retried']}/{values['steps_recorded']}",
             ("", "retries/step"): format_number(values["retries_median"]),
             ("", "fewest retries"): f"{format_number(values['fewest_retries'])} "
                                     f"({at_fewest} step{'' if at_fewest == 1 else 's'})",
             ("", "s/step at fewest"): format_number(values["step_time_s_at_fewest"])}
    if values["retry_cost_s"] is not None:
        cells[("", "ms/retry")] = _ms(values["retry_cost_s"])
        cells[("", "95% interval")] = f"[{_ms(values['retry_cost_ci95_low'])}, {_ms(values['retry_cost_ci95_high'])}]"
    return cells


RETRY_COLUMNS = [("", name) for name in ("arm", "runs", "measured", "retried", "retries/step", "fewest retries",
                                         "s/step at fewest", "s/step", "ms/retry", "95% interval")]


GC = "gc_s"
GC_VALUES = ("steps_gc_recorded", "steps_with_gc", "gc_s_mean")
GC_COLUMNS = [("", "steps with GC"), ("", "GC ms/step")]


def _pooled(runs: Sequence[pd.DataFrame], field: str) -> pd.Series:
    """A step field's values over a point's measured steps, its runs pooled; empty where no run recorded it."""
    return pd.Series([value for run in runs if field in run for value in run[field].astype(float)],
                     dtype=float).dropna()


def _count_and_ms_cells(values: Mapping[str, Any], names: tuple[str, str, str],
                        columns: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """`counted/recorded` and milliseconds, from the values `names` = (recorded, counted, seconds); none where
    nothing was recorded."""
    recorded, counted, seconds = names
    if values[seconds] is None:
        return {}
    return {columns[0]: f"{values[counted]}/{values[recorded]}", columns[1]: _ms(values[seconds])}


def gc_values(runs: Sequence[pd.DataFrame]) -> dict[str, float | None]:
    """Python's garbage collector inside a point's measured steps, its runs pooled: the steps a collection landed
    in and the mean milliseconds a step spent in it; None where no run recorded it (runs before gc_s)."""
    seconds = _pooled(runs, GC)
    if seconds.empty:
        return dict.fromkeys(GC_VALUES)
    return dict(zip(GC_VALUES, (len(seconds), int((seconds > 0).sum()), float(seconds.mean()))))


SYNC = "end_sync_s"
SYNC_VALUES = ("steps_sync_recorded", "steps_host_paced", "end_sync_s_median")
SYNC_COLUMNS = [("", "host-paced steps"), ("", "end wait ms")]
HOST_PACED_S = 1e-3  # a closing synchronize this short: the device had caught up with the host before it


def sync_values(runs: Sequence[pd.DataFrame]) -> dict[str, float | None]:
    """The host's wait in each measured step's closing synchronize, its runs pooled: the steps the host paced (a
    wait under HOST_PACED_S) and the median wait; None where no run recorded it (CPU runs, runs before end_sync_s)."""
    seconds = _pooled(runs, SYNC)
    if seconds.empty:
        return dict.fromkeys(SYNC_VALUES)
    return dict(zip(SYNC_VALUES, (len(seconds), int((seconds < HOST_PACED_S).sum()), float(seconds.median()))))


# Column groups shown only where some point's runs recorded them, so the reports of runs without them stay the same:
# (the value that tells, the values, the columns, the caption's sentence).
RECORDED_ONLY = (
    ("gc_s_mean", GC_VALUES, GC_COLUMNS,
     " steps with GC, GC ms/step: the measured steps a collection of Python's garbage collector ran in and the mean "
     "milliseconds a step spent in it (gc_s; train.gc); '-' where not recorded."),
    ("end_sync_s_median", SYNC_VALUES, SYNC_COLUMNS,
     f" host-paced steps, end wait ms: the measured steps whose closing synchronize waited under "
     f"{HOST_PACED_S * 1000:g} ms (the host, not the device, set their pace) and the median wait (end_sync_s; "
     "train.step_sync); '-' where not recorded."),
)


def retry_table(points: pd.DataFrame, steps: pd.DataFrame) -> Table:
    """Per design point: how many of its measured steps the allocator retried on, the median retries per step, step
    time on the steps with the fewest retries and on all, and what one retry costs (ms, with its 95% interval);
    where the runs recorded them, the other pause inside a step, Python's garbage collector (steps, mean ms/step),
    and who set the steps' pace, from the host's wait at each step's end (steps under 1 ms, median ms)."""
    rows, lines = [], []
    for row, label, group, runs in steps_by_design_point(points, steps):
        head, cells = _point_head(row, label, group, runs)
        values = {**retry_values(runs), **gc_values(runs), **sync_values(runs)}
        rows.append({**head, **values})
        lines.append({**cells, ("", "s/step"): _step_time_cell(values["step_time_s"], head), **_retry_cells(values),
                      **_count_and_ms_cells(values, GC_VALUES, GC_COLUMNS),
                      **_count_and_ms_cells(values, SYNC_VALUES, SYNC_COLUMNS)})
    values = pd.DataFrame(rows)
    caption = ("Allocator retries on the final phase's measured steps, the runs of a point pooled (a retry is a "
               "device synchronize, a flush of every cached block and a new cudaMalloc). s/step: medians over the "
               "steps with the fewest retries and over all. ms/retry: the Theil-Sen slope of step time on retries "
               "per step with its 95% interval (scipy.stats.theilslopes); '-' where retries do not vary within the "
               "point.")
    columns = list(RETRY_COLUMNS)
    for telling, names, group_columns, sentence in RECORDED_ONLY:
        if telling in values and values[telling].notna().any():
            caption += sentence
            columns += group_columns
        else:
            values = values.drop(columns=list(names), errors="ignore")
    recorded_counts = [name for _, names, _, _ in RECORDED_ONLY for name in names[:2]]  # (recorded, counted)
    counts = {name: "Int64" for name in (*RETRY_COUNTS, *recorded_counts) if name in values}
    return Table("retries", values.astype(counts), display_frame(lines, columns), caption=caption)
