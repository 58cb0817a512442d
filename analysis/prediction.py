"""The planner's predicted peaks against the measured ones: each point's own plan (`prediction_table`).
Each returns a `Table` (analysis.tables)."""
from __future__ import annotations

import pandas as pd

from analysis.design import design, is_missing
from analysis.load import GB
from analysis.tables import NOT_APPLICABLE, Table, aggregate_repeats, cell, display_frame, runs_cell


PREDICTED = "predicted_peak_bytes"
STEP_PEAKS = ("peak_allocated_bytes", "fwd_bwd_peak_allocated_bytes", "opt_step_peak_allocated_bytes")
PREDICTION_COLUMNS = {  # -> (column title, divisor); measured: the final phase's steps after its compile step
    "planned_offload_bytes": ("offloaded (GB)", GB),
    PREDICTED: ("predicted peak (GB)", GB),
    "final_steady_peak_allocated_bytes": ("measured peak (GB)", GB),
    "final_steady_fwd_bwd_peak_allocated_bytes": ("fwd+bwd (GB)", GB),
    "final_steady_opt_step_peak_allocated_bytes": ("optimizer step (GB)", GB),
}


def steady_peaks(points: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Each point with the highest of its step peaks (STEP_PEAKS, as final_steady_<peak>) over the final phase's steps
    after its compile step, whose peak can be the compiler's (DeepCompile's profiling)."""
    columns = [peak for peak in STEP_PEAKS if peak in steps]
    if steps.empty or "peak_allocated_bytes" not in columns:
        return points.assign(**{f"final_steady_{peak}": float("nan") for peak in STEP_PEAKS})
    final = steps[steps["phase"] == steps.groupby("run_dir")["phase"].transform("max")]
    steady = final[final["phase_step"] > 0].groupby("run_dir")[columns].max()
    steady = steady.rename(columns=lambda peak: f"final_steady_{peak}").reindex(
        columns=[f"final_steady_{peak}" for peak in STEP_PEAKS])
    return points.merge(steady, left_on="run_dir", right_index=True, how="left")


def has_predictions(points: pd.DataFrame) -> bool:
    """Whether any point has a planner's predicted peak."""
    return PREDICTED in points and points[PREDICTED].notna().any()


def prediction_table(points: pd.DataFrame, steps: pd.DataFrame) -> Table:
    """The planner's predicted peak allocated bytes against the measured one (final phase, after its compile step),
    with the step's two segments measured apart where the run recorded them, and the error."""
    measured = steady_peaks(points[points[PREDICTED].notna()], steps)
    points_design = design(measured)
    values = aggregate_repeats(measured, points_design.keys, list(PREDICTION_COLUMNS))
    lines = []
    for row in values.to_dict("records"):
        line = {("", "arm"): points_design.label(row), ("", "runs"): runs_cell(row),
                **{("", name): cell(row, value, scale) for value, (name, scale) in PREDICTION_COLUMNS.items()}}
        measured_peak = row.get("final_steady_peak_allocated_bytes")
        error = None if not row["n_ok"] or is_missing(measured_peak) else \
            (row[PREDICTED] - measured_peak) / measured_peak
        line[("", "error")] = NOT_APPLICABLE if error is None else f"{error:+.1%}"
        lines.append(line)
    return Table("prediction", values, display_frame(lines))
