"""Memory tables: peak allocated and reserved memory per design point and phase (`memory_table`), and our pass's
copies hidden against exposed (`transfers_table`). Each returns a `Table` (analysis.tables)."""
from __future__ import annotations

import re

import pandas as pd

from analysis.design import design, format_value, is_missing
from analysis.load import OK
from analysis.tables import NOT_APPLICABLE, STEP_TIME, Table, aggregate_repeats, cell, display_frame, runs_cell
from harness.contract.steps import columns as declared_columns


PHASE_PATTERN = re.compile(r"^phase(\d+)_(.+)$")


def memory_columns() -> dict[str, tuple[str, float]]:
    """Per-phase stat -> (column title, divisor), as the step fields declare the memory table's columns."""
    return {f"{field.name}_{column.stat}": (column.title, field.scale) for field, column in declared_columns("memory")}


def phase_rows(points: pd.DataFrame) -> pd.DataFrame:
    """One row per (point, phase) with the phase's stats unprefixed; a failed point gets one row, phase None."""
    rows = []
    for point in points.to_dict("records"):
        base = {column: value for column, value in point.items() if not PHASE_PATTERN.match(column)}
        if point["status"] != OK or not point.get("n_phases"):
            rows.append({**base, "phase": None})
            continue
        for phase in range(int(point["n_phases"])):
            stats = {match.group(2): value for column, value in point.items()
                     if (match := PHASE_PATTERN.match(column)) and int(match.group(1)) == phase}
            rows.append({**base, **stats, "phase": phase})
    return pd.DataFrame(rows)


def memory_table(points: pd.DataFrame) -> Table:
    """Per design point and phase: peak allocated and reserved (GB), bytes offloaded and reloaded per step
    (GB), allocator retries, the host's resident and pinned bytes (GB)."""
    points_design = design(points)
    keys = points_design.keys
    rows = phase_rows(points)
    # a field no run recorded (run files older than its declaration) gets no column; a null reading shows as "-"
    shown = {value: column for value, column in memory_columns().items() if value in rows}
    values = aggregate_repeats(rows, [*keys, "phase"], shown)
    lines = []
    for row in values.to_dict("records"):
        line = {("", "arm"): points_design.label(row),
                ("", "phase"): NOT_APPLICABLE if is_missing(row["phase"]) else format_value(row["phase"]),
                ("", "runs"): runs_cell(row)}
        for value, (name, scale) in shown.items():
            line[("", name)] = cell(row, value, scale)
        lines.append(line)
    return Table("memory", values, display_frame(lines))


def transfer_columns() -> dict[str, tuple[str, float]]:
    """Final-phase stat per step -> (column title, divisor): the transfers table's columns as the step fields
    declare them, then the step time they are set against."""
    declared = {f"final_{field.name}_{column.stat}": (column.title, field.scale)
                for field, column in declared_columns("transfers")}
    return {**declared, STEP_TIME: ("step (s)", 1)}


def has_transfers(points: pd.DataFrame) -> bool:
    """Whether any point measured its copies (our pass, since stalls are recorded)."""
    column = "final_offload_stall_s_median"
    return column in points and points[column].notna().any()


def transfers_table(points: pd.DataFrame) -> Table:
    """Hidden against exposed transfer, per design point that measured its copies (final phase, per step): bytes
    offloaded, how long each copy stream was busy, how long compute stood waiting for them, the step time."""
    measured = points[points["final_offload_stall_s_median"].notna()]
    points_design = design(measured)
    shown = transfer_columns()
    values = aggregate_repeats(measured, points_design.keys, list(shown))
    lines = [{("", "arm"): points_design.label(row), ("", "runs"): runs_cell(row),
              **{("", name): cell(row, value, scale) for value, (name, scale) in shown.items()}}
             for row in values.to_dict("records")]
    return Table("transfers", values, display_frame(lines))
