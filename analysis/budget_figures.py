"""Figures against the memory budget: the offload arms' final-phase step time (IQR bars) with the bytes offloaded
per step on a second axis, and their peak reserved memory against the budget line; the non-offload arms as horizontal
references. A sweep whose series each hold one budget gets none (`budget_swept`)."""
from __future__ import annotations

import math

import matplotlib as mpl
import matplotlib.pyplot as plt
import pandas as pd

from analysis.design import design
from analysis.layout import legend_below
from analysis.load import GB, OK
from analysis.plots import (PAPER_RC, Plot, annotate_failures, arm_style, concat_data, data_rows, median_with_iqr,
                            no_data, peak_reserved_with_spread, series_styles)
from analysis.tables import (BUDGET_SOURCE, NON_OFFLOAD_ARMS, OFFLOAD_ARMS, PEAK_RESERVED, STEP_TIME,
                             aggregate_repeats, budget_label, with_budget_source, with_planned_budgets)

OFFLOADED_STYLE = {"linestyle": "--", "markerfacecolor": "none"}  # GB offloaded per step, beside the step time


def _budget_points(points: pd.DataFrame, values: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Offload arms by budget (ok and failed) and the non-offload arms' ok rows, as series labelled by what
    varies between these points (the figure shows no other); a point planned without a budget is a series of its
    own, named by the rule that made its budget (tables.budget_label)."""
    shown = points[points["arm"].isin(OFFLOAD_ARMS)
                   | (points["arm"].isin(NON_OFFLOAD_ARMS) & (points["status"] == OK))]
    points_design = design(shown)
    keys = [*points_design.keys, BUDGET_SOURCE]
    sourced = with_budget_source(shown)
    aggregated = with_planned_budgets(aggregate_repeats(sourced, keys, [*values, "budget_resolved_gb"]), sourced, keys)
    aggregated["series"] = [budget_label(points_design, row) for row in aggregated.to_dict("records")]
    offload = aggregated[aggregated["arm"].isin(OFFLOAD_ARMS)].sort_values(["series", "budget_resolved_gb"])
    references = aggregated[aggregated["arm"].isin(NON_OFFLOAD_ARMS) & (aggregated["n_ok"] > 0)]
    return offload[offload["n_ok"] > 0], offload[offload["n_ok"] == 0], references


def budget_swept(points: pd.DataFrame) -> bool:
    """Whether some series of the figures against the budget holds more than one budget: a budget in GB or as a
    fraction, or none (the margin or our pass's device rule then makes one, tables.budget_source). With one budget
    per series (11 GB for both passes; the capacity campaign's auto budgets, one per arm and length) the figures
    would draw lone points whose x says nothing the tables do not."""
    ok, failed, _ = _budget_points(points, [STEP_TIME])
    offload = pd.concat([ok, failed])
    return bool(not offload.empty and (offload.groupby("series")["budget_resolved_gb"].nunique() > 1).any())


def step_time_vs_budget(points: pd.DataFrame) -> Plot:
    """Final-phase median step time (IQR bars) of the offload arms against the budget, GB offloaded per step
    on a second axis, non-offload arms as horizontal references."""
    p25, p75 = "final_step_time_s_p25", "final_step_time_s_p75"
    ok, failed, references = _budget_points(points, [STEP_TIME, p25, p75, "final_offload_bytes_median"])
    data = []
    with mpl.rc_context(PAPER_RC):
        figure, ax = plt.subplots(figsize=(4.8, 3.2), layout="constrained")
        offloaded_ax = ax.twinx()
        offloaded_ax.grid(False)
        styles = series_styles(ok)
        for series, frame in ok.groupby("series", sort=False):
            data.append(median_with_iqr(ax, frame, series, "step_time_s", "budget_resolved_gb", STEP_TIME, p25, p75,
                                        styles[series]))
            if frame["final_offload_bytes_median"].notna().any():
                offloaded_ax.plot(frame["budget_resolved_gb"], frame["final_offload_bytes_median"] / GB,
                                  color=styles[series].colour, marker=styles[series].marker,
                                  markersize=styles[series].markersize, **OFFLOADED_STYLE)
                data.append(data_rows(frame, "offloaded_gb", "budget_resolved_gb",
                                      "final_offload_bytes_median", scale=GB))
        for row in references.to_dict("records"):
            ax.axhline(row[STEP_TIME], color=arm_style(row["arm"])[0], linestyle=":",
                       label=f"{row['series']} (no offload)")
        data.append(_reference_rows(references, STEP_TIME))
        annotate_failures(ax, failed, "budget_resolved_gb")
        data.append(data_rows(failed, "failed", "budget_resolved_gb", STEP_TIME))
        if ok.empty and failed.empty:
            no_data(ax, "offload points")
        if offloaded_ax.lines:  # one key for every series' dashed twin: a series is in the legend once
            offloaded_ax.plot([], [], color="black", marker="o", label="offloaded/step (right axis)", **OFFLOADED_STYLE)
        ax.set_xlabel("memory budget (GB)")
        ax.set_ylabel("step time (s), final phase")
        offloaded_ax.set_ylabel("offloaded/step (GB), dashed")
        legend_below(figure, ax, offloaded_ax)
    return Plot("step_time_vs_budget", figure, concat_data(data))


def peak_reserved_vs_budget(points: pd.DataFrame) -> Plot:
    """Final-phase peak reserved memory of the offload arms against the budget (bars: min-max over
    repeats), with the budget itself as a line and non-offload arms as horizontal references."""
    ok, failed, references = _budget_points(points, [PEAK_RESERVED])
    data = []
    with mpl.rc_context(PAPER_RC):
        figure, ax = plt.subplots(figsize=(4.8, 3.2), layout="constrained")
        styles = series_styles(ok)
        for series, frame in ok.groupby("series", sort=False):
            data.append(peak_reserved_with_spread(ax, frame, series, "budget_resolved_gb", styles[series]))
        budgets = sorted(pd.concat([ok["budget_resolved_gb"], failed["budget_resolved_gb"]]).dropna().unique())
        if budgets:
            ax.plot(budgets, budgets, color="black", linestyle="--", linewidth=0.8, label="budget")
        for row in references.to_dict("records"):
            ax.axhline(row[PEAK_RESERVED] / GB, color=arm_style(row["arm"])[0], linestyle=":",
                       label=f"{row['series']} (no offload)")
        data.append(_reference_rows(references, PEAK_RESERVED, scale=GB))
        annotate_failures(ax, failed, "budget_resolved_gb")
        data.append(data_rows(failed, "failed", "budget_resolved_gb", PEAK_RESERVED, scale=GB))
        if ok.empty and failed.empty:
            no_data(ax, "offload points")
        ax.set_xlabel("memory budget (GB)")
        ax.set_ylabel("peak reserved (GB), final phase")
        legend_below(figure, ax)
    return Plot("peak_reserved_vs_budget", figure, concat_data(data))


def _reference_rows(references: pd.DataFrame, value: str, scale: float = 1.0) -> pd.DataFrame:
    return pd.DataFrame({"series": references["series"].tolist(), "kind": "reference", "x": math.nan,
                         "y": (references[value] / scale).tolist(), "y_low": math.nan, "y_high": math.nan,
                         "status": OK})


