"""The arms side by side at one workload and budget (the limit campaigns): each design point's median over runs with
its 95% interval, each run's median beside it, and each comparison's ratio with its interval in the title."""
from __future__ import annotations

import math

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from analysis.budget_figures import budget_swept
from analysis.design import format_value, is_missing, varies
from analysis.layout import wrap
from analysis.load import OK
from analysis.plots import PAPER_RC, Plot, annotate_failures, concat_data, series_styles
from analysis.tables import OFFLOAD_ARMS, WORKLOAD_COLUMNS, failed_statuses
from harness.contract import stats

ESTIMATE_KEY = "median over runs, 95% interval"
RUN_MEDIAN_KEY = "one run's median"
RUN_OFFSET = 0.14  # how far right (in categories) the runs' medians sit beside their point's estimate


def arms_at_one_point(points: pd.DataFrame) -> bool:
    """Whether the sweep's ok points, of two arms or more, share one workload and one budget (the limit
    campaigns: our pass and DeepSpeed's at 11 GB, repeated): no figure against an axis shows them apart, so
    step_time_by_arm draws them side by side."""
    from analysis.measurement import LIMIT_COLUMNS

    ok = points[points["status"] == OK]
    shared = [column for column in (*WORKLOAD_COLUMNS, *LIMIT_COLUMNS) if column in ok]
    return ok["arm"].nunique() > 1 and not budget_swept(ok) and not any(varies(ok[column]) for column in shared)


def step_time_by_arm(points: pd.DataFrame, steps: pd.DataFrame) -> Plot:
    """Final-phase step time of each design point at one workload and budget, side by side: the median over runs
    of each run's median with its 95% two-level bootstrap interval (the measurement table's), each run's median
    beside it, and in the title each comparison's ratio with its interval (the comparison table's)."""
    from analysis.measurement import comparison_table, runs_by_design_point

    design_points = runs_by_design_point(points, steps)
    rows, run_rows = [], []
    for position, (row, label, group, runs) in enumerate(design_points):
        estimate = stats.median_of_runs(runs) if runs else math.nan
        interval = stats.runs_interval(runs) or (math.nan, math.nan)
        rows.append({"series": label, "arm": row["arm"], "x": float(position), "y": estimate, "y_low": interval[0],
                     "y_high": interval[1], "failed": failed_statuses(group["status"]) if not runs else ""})
        run_rows += [{"series": label, "x": float(position), "y": float(np.median(run))} for run in runs]
    frame = pd.DataFrame(rows, columns=["series", "arm", "x", "y", "y_low", "y_high", "failed"])
    ok, failed = frame[frame["failed"] == ""], frame[frame["failed"] != ""]
    data = []
    with mpl.rc_context(PAPER_RC):
        figure, ax = plt.subplots(figsize=(1.6 + 1.1 * len(frame), 3.2), layout="constrained")
        styles = series_styles(frame)
        for row in ok.to_dict("records"):
            style = styles[row["series"]]
            ax.errorbar([row["x"]], [row["y"]], yerr=[[row["y"] - row["y_low"]], [row["y_high"] - row["y"]]],
                        color=style.colour, marker=style.marker, markersize=style.markersize - 1, linestyle="none",
                        elinewidth=1.5, capsize=4)
            mine = [run["y"] for run in run_rows if run["series"] == row["series"]]
            ax.plot([row["x"] + RUN_OFFSET] * len(mine), mine, linestyle="none", marker=style.marker,
                    markersize=3.5, markerfacecolor="none", color=style.colour)
        data.append(ok.assign(kind="step_time_s", status=OK)[["series", "kind", "x", "y", "y_low", "y_high",
                                                               "status"]])
        data.append(pd.DataFrame({"series": [run["series"] for run in run_rows], "kind": "run_median",
                                  "x": [run["x"] for run in run_rows], "y": [run["y"] for run in run_rows],
                                  "y_low": math.nan, "y_high": math.nan, "status": OK}))
        annotate_failures(ax, failed.rename(columns={"x": "position"}), "position")
        data.append(pd.DataFrame({"series": failed["series"], "kind": "failed", "x": failed["x"], "y": math.nan,
                                  "y_low": math.nan, "y_high": math.nan, "status": failed["failed"]}))
        ax.set_xticks(frame["x"], [wrap(label, 150, mpl.rcParams["xtick.labelsize"]) for label in frame["series"]])
        ax.set_xlim(-0.6, len(frame) - 0.4)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("step time (s), final phase")
        ax.grid(axis="x", visible=False)
        ratios = comparison_table(points, steps).values
        title = [f"{row['point']} / {row['against']}: "
                 f"{stats.ratio_text(row['ratio'], row['ci95_low'], row['ci95_high'])}, {row['reads']}"
                 for row in ratios.to_dict("records")]
        ax.set_title("\n".join([_context_line(points), *title]))
        if not ok.empty:
            key = [Line2D([], [], color="black", marker="o", markersize=4, linestyle="none"),
                   Line2D([], [], color="black", marker="o", markersize=3.5, markerfacecolor="none",
                          linestyle="none")]
            figure.legend(key, [ESTIMATE_KEY, RUN_MEDIAN_KEY], loc="outside lower center", ncols=2, frameon=False)
    return Plot("step_time_by_arm", figure, concat_data(data))


def _context_line(points: pd.DataFrame) -> str:
    """What the points share, for the title: the model and workload, and the budget the offload arms were given."""
    ok = points[points["status"] == OK]
    first = ok.iloc[0]
    parts = [str(first["model"]), f"micro-batch {format_value(first['micro_batch'])}",
             f"seq {format_value(first['seq_len'])}"]
    offload = ok[ok["arm"].isin(OFFLOAD_ARMS)]
    if "budget_gb" in offload and not offload.empty and not is_missing(offload["budget_gb"].iloc[0]):
        parts.append(f"budget {format_value(offload['budget_gb'].iloc[0])} GB")
    return ", ".join(parts)


