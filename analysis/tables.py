"""Paper tables from the tidy points: repeats folded into medians with their spread, failures by status (memory and
transfers: memory_tables.py; predicted against measured peaks: prediction.py).

Each builder returns a `Table`: `values` holds the numbers (one row per design point, or per design point
and phase), `display` the strings a reader sees, with two-level columns (group, name) where cells are
grouped under a swept value.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from analysis.design import (GIVEN_BUDGET_COLUMNS, OFFLOAD_ARMS, Design, along_axis, budget_source, design,
                             format_value, is_missing, varies)
from analysis.load import GB, OK
from harness.arms import arm_names

ARMS = arm_names()  # the tables' row order
BASELINE_ARM = arm_names(lambda arm: arm.baseline)[0]
NON_OFFLOAD_ARMS = arm_names(lambda arm: arm.keeps_optimizer_states_on_gpu)
# What a training step computes, and on how much device memory: two points with equal values here are
# comparable across arms.
WORKLOAD_COLUMNS = ("model", "micro_batch", "seq_len", "grad_accum", "dtype", "nproc_per_node", "nnodes",
                    "device_memory_gb")
AXIS_LABELS = {"seq_len": "seq", "micro_batch": "mb"}
NOT_APPLICABLE = "-"

# Where budgets are the key (the budget table, the figures against the budget), a point planned without a budget is
# named by the rule that made its budget, not by the budget keys it left null.
BUDGET_SOURCE = "budget_source"  # design.budget_source's
BUDGET_KEYS = (*GIVEN_BUDGET_COLUMNS, "margin", "auto_rule")  # said by the budget or its source

STEP_TIME = "final_step_time_s_median"
TOKENS_PER_S = "final_tokens_per_s_median"
PEAK_RESERVED = "final_peak_reserved_bytes_max"
RESERVED_GROWTH = "final_reserved_growth_bytes"  # measurement.with_reserved_growth's, from the measured steps


@dataclass
class Table:
    name: str
    values: pd.DataFrame
    display: pd.DataFrame  # strings; columns are (group, name) pairs, group "" for ungrouped columns
    caption: str = ""  # what the cells are, where the columns alone do not say it


def swept_axis(points: pd.DataFrame) -> str:
    """The throughput table's column axis: sequence length if it varies, else micro-batch."""
    for axis in AXIS_LABELS:
        if axis in points and varies(points[axis]):
            return axis
    return "seq_len"


def aggregate_repeats(points: pd.DataFrame, keys: Sequence[str], values: Iterable[str],
                      outcome: str = "status") -> pd.DataFrame:
    """One row per key: each value's median over the ok repeats with min and max (NaN where no repeat has
    it, or no point has the column), run counts, failures (named by the `outcome` column: the status, or
    the status with a detail such as 'oom (p1)')."""
    values = list(values)
    rows = []
    for key, group in points.groupby(list(keys), dropna=False, sort=False):
        ok = group[group["status"] == OK]
        row: dict[str, Any] = {name: _none_if_nan(value) for name, value in zip(keys, key)}
        row.update(n_runs=len(group), n_ok=len(ok), failed=failed_statuses(group[outcome]))
        for value in values:
            numbers = ok[value].dropna().astype(float).tolist() if value in ok else []
            row[value] = statistics.median(numbers) if numbers else math.nan
            row[f"{value}_min"] = min(numbers) if numbers else math.nan
            row[f"{value}_max"] = max(numbers) if numbers else math.nan
        rows.append(row)
    columns = [*keys, "n_runs", "n_ok", "failed",
               *(f"{value}{stat}" for value in values for stat in ("", "_min", "_max"))]
    frame = pd.DataFrame(rows, columns=columns)  # the columns also when no point is given
    return frame.sort_values(list(keys), key=order_key, kind="stable").reset_index(drop=True)


def failed_statuses(statuses: Iterable[str]) -> str:
    """'OOM', '2 DIED', 'DIED/OOM': how the non-ok runs ended, uppercase as the tables show them; a detail
    after the status keeps its case ('oom (p1)' -> 'OOM (p1)')."""
    counts: dict[str, int] = {}
    for status in statuses:
        if status != OK:
            name, _, detail = status.partition(" ")
            shown = f"{name.upper()} {detail}" if detail else name.upper()
            counts[shown] = counts.get(shown, 0) + 1
    return "/".join(f"{count} {status}" if count > 1 else status for status, count in sorted(counts.items()))


def _none_if_nan(value: Any) -> Any:
    return None if is_missing(value) else value


def order_key(column: pd.Series) -> pd.Series:
    """Arms in their fixed order, numbers by value, missing last."""
    if column.name == "arm":
        return column.map(lambda arm: (ARMS.index(arm) if arm in ARMS else len(ARMS), str(arm)))
    return column.map(lambda value: (1, 0.0, "") if is_missing(value) else (
        (0, float(value), "") if isinstance(value, (int, float)) and not isinstance(value, bool)
        else (0, math.inf, str(value))))


def format_number(value: float) -> str:
    if is_missing(value):
        return NOT_APPLICABLE
    if abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:.4g}"


def cell(row: Mapping[str, Any], value: str, scale: float = 1.0) -> str:
    """A measured cell: the status when no repeat ran ok, else the median, [min, max] over repeats, and
    how many other repeats failed."""
    if row["n_ok"] == 0:
        return row["failed"]
    if is_missing(row.get(value)):
        return NOT_APPLICABLE
    text = format_number(row[value] / scale)
    if row["n_ok"] > 1 and row[f"{value}_min"] != row[f"{value}_max"]:
        text += f" [{format_number(row[f'{value}_min'] / scale)}, {format_number(row[f'{value}_max'] / scale)}]"
    if row["failed"]:
        text += f" (+{row['failed']})"
    return text


def _workload(row: Mapping[str, Any], keys: Sequence[str]) -> tuple:
    return tuple(format_value(row[key]) for key in keys if key in WORKLOAD_COLUMNS)


def add_speedups(aggregated: pd.DataFrame, keys: Sequence[str], step_time: str = STEP_TIME) -> pd.DataFrame:
    """speedup_vs_zero3 and speedup_vs_best_base (fastest of zero3/deepcompile) on the same workload,
    where both ran: baseline step time / this step time, so > 1 is faster."""
    frame = aggregated.copy()
    records = frame.to_dict("records")

    def fastest(workload: tuple, arms: Sequence[str]) -> float:
        times = [r[step_time] for r in records
                 if r["arm"] in arms and r["n_ok"] > 0 and _workload(r, keys) == workload]
        return min(times) if times else math.nan

    for name, arms in (("speedup_vs_zero3", (BASELINE_ARM,)), ("speedup_vs_best_base", NON_OFFLOAD_ARMS)):
        frame[name] = [fastest(_workload(r, keys), arms) / r[step_time] if r["n_ok"] > 0 else math.nan
                       for r in records]
    return frame


def axis_label(axis: str, value: Any) -> str:
    """'seq 2048', 'mb 4': a column of the swept axis."""
    return f"{AXIS_LABELS.get(axis, axis)} {format_value(value)}"


def _speedup_cell(row: Mapping[str, Any], name: str) -> str:
    if row["n_ok"] == 0:
        return row["failed"]
    return NOT_APPLICABLE if is_missing(row[name]) else f"{row[name]:.2f}x"


def throughput_table(points: pd.DataFrame, axis: str | None = None) -> Table:
    """Rows = design points but the axis, column groups = the axis's values: final-phase median step time,
    tokens/s, speed-up vs zero3 and vs the best non-offload arm."""
    axis = axis or swept_axis(points)
    points_design = design(points)
    keys, on_axis = along_axis(points_design, points, axis)
    values = add_speedups(aggregate_repeats(points, keys, [STEP_TIME, TOKENS_PER_S]), keys)
    values["label"] = [points_design.label(row, leave_out=on_axis) for row in values.to_dict("records")]
    cells: dict[str, dict[tuple[str, str], str]] = {}
    for row in values.to_dict("records"):
        group = axis_label(axis, row[axis])
        line = cells.setdefault(row["label"], {("", "arm"): row["label"]})
        line[(group, "s/step")] = cell(row, STEP_TIME)
        line[(group, "tok/s")] = cell(row, TOKENS_PER_S)
        line[(group, "vs zero3")] = _speedup_cell(row, "speedup_vs_zero3")
        line[(group, "vs best base")] = _speedup_cell(row, "speedup_vs_best_base")
    columns = [("", "arm")] + [(axis_label(axis, value), name) for value in swept_values(values[axis])
                               for name in ("s/step", "tok/s", "vs zero3", "vs best base")]
    return Table("throughput", values.drop(columns="label"), display_frame(list(cells.values()), columns))


def swept_values(column: pd.Series) -> list[str]:
    """The distinct values of a swept column as labels show them, numbers in numeric order."""
    return sorted({format_value(value) for value in column}, key=_numeric_first)


def _numeric_first(text: str) -> tuple:
    try:
        return (0, float(text), text)
    except ValueError:
        return (1, 0.0, text)


def runs_cell(row: Mapping[str, Any]) -> str:
    """'2/3 ok': of a row of aggregate_repeats."""
    return f"{row['n_ok']}/{row['n_runs']} ok"


def display_frame(lines: list[dict[tuple[str, str], str]],
                  columns: Sequence[tuple[str, str]] | None = None) -> pd.DataFrame:
    """Lines of cells as a display frame, "-" where a line has no cell; columns in the order given, else
    in the order the lines first have them."""
    columns = list(columns) if columns is not None else list(dict.fromkeys(c for line in lines for c in line))
    return pd.DataFrame([[line.get(column, NOT_APPLICABLE) for column in columns] for line in lines],
                        columns=pd.MultiIndex.from_tuples(columns) if columns else None)


def policies_table(points: pd.DataFrame) -> Table:
    """Rows = empty_cache policy (within each other design point), column groups = copy-stream mode:
    final-phase median step time, peak reserved, and how far reserved memory grew over the measured steps (where
    the points carry RESERVED_GROWTH, else '-')."""
    points_design = design(points)
    keys = [key for key in points_design.keys if key not in ("empty_cache", "streams")] + ["empty_cache", "streams"]
    values = aggregate_repeats(points, keys, [STEP_TIME, PEAK_RESERVED, RESERVED_GROWTH])
    cells: dict[str, dict[tuple[str, str], str]] = {}
    for row in values.to_dict("records"):
        context = points_design.label(row, leave_out=["empty_cache", "streams"])
        line = cells.setdefault(f"{context}|{row['empty_cache']}",
                                {("", "arm"): context, ("", "empty_cache"): format_value(row["empty_cache"])})
        group = f"streams {format_value(row['streams'])}"
        line[(group, "s/step")] = cell(row, STEP_TIME)
        line[(group, "peak reserved (GB)")] = cell(row, PEAK_RESERVED, GB)
        line[(group, "reserved growth (GB)")] = cell(row, RESERVED_GROWTH, GB)
    return Table("policies", values, display_frame(list(cells.values())))


def with_budget_source(points: pd.DataFrame) -> pd.DataFrame:
    """The points with their BUDGET_SOURCE column, to group and label by (after `design`, which it is not for)."""
    return points.assign(**{BUDGET_SOURCE: [budget_source(point) for point in points.to_dict("records")]})


def with_planned_budgets(aggregated: pd.DataFrame, points: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """budget_resolved_gb also where no repeat ran ok: a point that failed after planning (out of memory in a
    step) ran at its plan's budget, whatever its status; one that never planned at its configured budget."""
    every_run = aggregate_repeats(points.assign(status=OK), keys, ["budget_resolved_gb"])  # the same rows, in order
    resolved = aggregated["budget_resolved_gb"].fillna(every_run["budget_resolved_gb"])
    if "budget_gb" in aggregated:
        resolved = resolved.fillna(aggregated["budget_gb"].astype(float))
    return aggregated.assign(budget_resolved_gb=resolved)


def budget_label(points_design: Design, row: Mapping[str, Any], leave_out: Iterable[str] = (),
                 one_budget: bool = False) -> str:
    """A label where budgets are the key: the design label less the budget keys, then the budget's source
    ('offload, auto (device rule)'), so an auto plan never reads like a budgeted point of the same arm. A row of
    `one_budget` (a table's) is flagged over budget by its own points only, a line across budgets (a figure's) by
    any along it."""
    label = points_design.label(row, leave_out=[*BUDGET_KEYS, *leave_out],
                                note_leave_out=leave_out if one_budget else None)
    source = row.get(BUDGET_SOURCE)
    return label if is_missing(source) else f"{label}, {source}"


def budget_table(points: pd.DataFrame) -> Table:
    """Offload arms by budget: resolved budget and bytes offloaded per step (GB, as budgets are given),
    step time, peak reserved (GB) and speed-up against the best non-offload arm."""
    points_design = design(points)
    keys = [*points_design.keys, BUDGET_SOURCE]
    values = [STEP_TIME, PEAK_RESERVED, "final_offload_bytes_median", "budget_resolved_gb"]
    sourced = with_budget_source(points)
    aggregated = with_planned_budgets(add_speedups(aggregate_repeats(sourced, keys, values), keys), sourced, keys)
    offload = aggregated[aggregated["arm"].isin(OFFLOAD_ARMS)]
    lines = []
    for row in offload.to_dict("records"):
        lines.append({
            ("", "arm"): budget_label(points_design, row, one_budget=True),
            ("", "budget (GB)"): format_value(row.get("budget_gb")) if is_missing(row["budget_resolved_gb"])
            else format_number(row["budget_resolved_gb"]),
            ("", "offloaded/step (GB)"): cell(row, "final_offload_bytes_median", GB),
            ("", "s/step"): cell(row, STEP_TIME),
            ("", "peak reserved (GB)"): cell(row, PEAK_RESERVED, GB),
            ("", "vs best base"): _speedup_cell(row, "speedup_vs_best_base"),
            ("", "runs"): runs_cell(row),
        })
    return Table("budget", offload.reset_index(drop=True), display_frame(lines))
