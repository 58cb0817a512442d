"""The planner's predicted peaks against the measured ones: each point's own plan, calibrated on its own run
(`prediction_table`), and each point planned again from another run's profile (`out_of_sample_table`). Each returns
a `Table` (analysis.tables).

The out-of-sample pairs come from `harness plan --out-of-sample SWEEP_DIR`, run as a command
(`out_of_sample_pairs`): planning is the offload package's, which the analysis does not import (it reads run files
through the contract alone), and the command's JSON is the hand-off. The report then always shows what the planner
of its checkout predicts, and rebuilds byte for byte only while that holds.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.columns import OVER_BUDGET
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
    return Table("prediction", values, display_frame(lines),
                 caption="In-sample: each point's plan is calibrated on its own run's steady step, measured before "
                         "planning, so the error says how well that calibration carries over to the later steps of the "
                         "same run. Out of sample (another run's profile): out_of_sample.md.")


PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the directory `import harness` needs on the path
PLAN_COMMAND = ("-m", "harness.cli", "plan", "--out-of-sample")


def out_of_sample_pairs(sweep_dir: str | Path) -> tuple[list[dict[str, Any]], list[str]]:
    """`harness plan --out-of-sample SWEEP_DIR`'s pairs (harness/offload/out_of_sample.py) and its warning lines (a
    profile that predicts no peak), for the notebook to show. A failing command raises with its last line."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT),
                                                                    os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, *PLAN_COMMAND, str(sweep_dir)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"harness plan --out-of-sample {sweep_dir} exited {done.returncode}: "
                           f"{(done.stderr.strip().splitlines() or [''])[-1]}")
    return json.loads(done.stdout), done.stderr.splitlines()


OUT_OF_SAMPLE_COLUMNS = ("profile from", "point predicted", "plan", "offloaded (GB)", "as it ran",
                         "predicted peak (GB)", "measured peak (GB)", "error")
NO_PAIR = "none: no other ok point of our pass with its model and shape"


def out_of_sample_table(points: pd.DataFrame, pairs: Sequence[Mapping[str, Any]]) -> Table:
    """One row per pair: the run dir whose profile planned, the point planned, the plan (rule, budget, bytes
    offloaded, whether the point's own plan offloaded as much) and its predicted against the point's measured
    peak; one row for each point that planned but has no pair, saying so."""
    planned = points[points["plan_rule"].notna()] if "plan_rule" in points else points.iloc[0:0]
    paired = {pair["profile_from"] for pair in pairs}
    rows = [*(dict(pair) for pair in pairs),
            *({"profile_from": run_dir, "point": None} for run_dir in planned["run_dir"] if run_dir not in paired)]
    values = pd.DataFrame(rows, columns=["profile_from", "point", "rule", "budget_bytes", "offloaded_bytes",
                                         "ran_offloaded_bytes", "predicted_peak_bytes", "measured_peak_bytes", "error"])
    over = dict(zip(points["run_dir"], points[OVER_BUDGET])) if OVER_BUDGET in points else {}
    lines = [_pair_line(row, over.get(row["point"])) for row in values.to_dict("records")]
    return Table("out_of_sample", values, display_frame(lines, [("", name) for name in OUT_OF_SAMPLE_COLUMNS]),
                 caption="Each point of our pass planned again from another run's profile.json (harness plan "
                         "--out-of-sample): that run's calibration, allocator overhead and graphs, this point's "
                         "budget, rule, policies and device. 'as it ran': whether the point's own plan offloaded as "
                         "much (the planner may have changed since). Error: (predicted - measured) / measured "
                         "final-phase peak allocated, after its compile step.")


def _pair_line(row: Mapping[str, Any], over_budget: float | None) -> dict[tuple[str, str], str]:
    """A pair's cells; the point predicted says where it went over its budget."""
    if is_missing(row["point"]):
        return {("", "profile from"): row["profile_from"], ("", "point predicted"): NO_PAIR}
    ran = row["ran_offloaded_bytes"]
    as_it_ran = NOT_APPLICABLE if is_missing(ran) else "yes" if ran == row["offloaded_bytes"] else \
        f"no ({ran / GB:.2f} GB ran)"
    over = not is_missing(over_budget) and over_budget > 0
    point = row["point"] + (f", over budget by {over_budget / GB:.2f} GB" if over else "")
    return {("", "profile from"): row["profile_from"], ("", "point predicted"): point,
            ("", "plan"): f"{row['rule']}, {row['budget_bytes'] / GB:.2f} GB",
            ("", "offloaded (GB)"): f"{row['offloaded_bytes'] / GB:.2f}", ("", "as it ran"): as_it_ran,
            ("", "predicted peak (GB)"): f"{row['predicted_peak_bytes'] / GB:.2f}",
            ("", "measured peak (GB)"): f"{row['measured_peak_bytes'] / GB:.2f}",
            ("", "error"): f"{row['error']:+.2%}"}
