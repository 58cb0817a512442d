"""Paper figures: one fixed colour and marker per arm in every figure, labelled axes with units, IQR error
bars. Each builder returns a `Plot` holding the figure and the tidy data it drew, so the data can be
saved beside the figure and compared between runs."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FormatStrFormatter, LogLocator, MaxNLocator, NullFormatter
from matplotlib.transforms import blended_transform_factory

from analysis.design import Design, along_axis, design, format_value, is_missing, varies
from analysis.layout import legend_below, wrap
from analysis.load import GB, OK
from analysis.render import to_csv
from analysis.tables import (BUDGET_SOURCE, NON_OFFLOAD_ARMS, OFFLOAD_ARMS, PEAK_RESERVED, STEP_TIME, TOKENS_PER_S,
                             WORKLOAD_COLUMNS, aggregate_repeats, budget_label, failed_statuses, order_key,
                             with_budget_source, with_planned_budgets)
from harness.contract import stats
from harness.arms import Arm, registered
from harness.contract.runfiles import job_order

# Each arm's colour and marker (harness/arms/), so arms stay apart in greyscale too.
ARM_STYLES = {name: (arm.display.colour, arm.display.marker) for name, arm in registered().items()}
OTHER_ARM_STYLE = (Arm.display.colour, Arm.display.marker)
# A second and later series of one arm keeps its colour and takes the next of these markers and line styles, so
# series of one arm stay apart (one-point series by their marker); none is another arm's marker, and dashed and
# dotted lines are left to the offloaded twin and the references.
MORE_MARKERS = ("*", "P", "h", "<", ">", "p", "d")  # no "x"/"X": an x marks a first OOM
MORE_LINESTYLES = ("-.", (0, (5, 1, 1, 1, 1, 1)), "-")
MORE_MARKER_SIZE = 7  # these markers fill less of their box than the arms' own
OFFLOADED_STYLE = {"linestyle": "--", "markerfacecolor": "none"}  # GB offloaded per step, beside the step time
FAILURE_FONTSIZE = 6
FAILURE_TEXT_WIDTH_PT = 110  # about a third of a figure's axes
PAPER_RC = {
    "font.family": "DejaVu Sans",  # ships with matplotlib: the same glyphs on every machine
    "font.size": 9,
    "axes.labelsize": 9,
    "axes.titlesize": 9,
    "legend.fontsize": 7,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "lines.linewidth": 1.2,
    "lines.markersize": 5,
    "errorbar.capsize": 2,
    "savefig.dpi": 200,
    "savefig.bbox": "tight",  # the saved page holds every artist, whatever the layout left outside
    "pdf.fonttype": 42,  # TrueType fonts: editable text in the paper's PDF
    "svg.hashsalt": "offload-harness",
}


@dataclass
class Plot:
    name: str
    figure: Figure
    data: pd.DataFrame  # one row per drawn point: series, x, y, y_low, y_high, ...


def arm_style(arm: str) -> tuple[str, str]:
    return ARM_STYLES.get(arm, OTHER_ARM_STYLE)


@dataclass(frozen=True)
class SeriesStyle:
    colour: str
    marker: str
    linestyle: object = "-"
    zorder: float = 2.0  # matplotlib's for lines; series_styles puts series of fewer points on top

    @property
    def markersize(self) -> float:
        return MORE_MARKER_SIZE if self.marker in MORE_MARKERS else mpl.rcParams["lines.markersize"]


def series_styles(frame: pd.DataFrame) -> dict[str, SeriesStyle]:
    """Each series' style: its arm's colour; the arm's first series its marker and a solid line, the arm's later
    series the next of MORE_MARKERS and MORE_LINESTYLES, so that no two series of one arm look alike."""
    styles: dict[str, SeriesStyle] = {}
    per_arm: dict[str, int] = {}
    sizes = frame["series"].value_counts()
    for series, arm in frame[["series", "arm"]].drop_duplicates("series").itertuples(index=False):
        colour, marker = arm_style(arm)
        position = per_arm[arm] = per_arm.get(arm, -1) + 1
        if position:
            marker = MORE_MARKERS[(position - 1) % len(MORE_MARKERS)]
        # a series of few points drawn over one of many, so a lone point at a shared x is not hidden under a line
        styles[series] = SeriesStyle(colour, marker, "-" if not position else
                                     MORE_LINESTYLES[(position - 1) % len(MORE_LINESTYLES)],
                                     zorder=2.0 + 1.0 / sizes[series])
    return styles


def save_plot(plot: Plot, out_dir: str | Path) -> list[Path]:
    """<name>.pdf, <name>.png and <name>_data.csv; no timestamps, so the same plot gives the same files."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{plot.name}.pdf", out_dir / f"{plot.name}.png"]
    with mpl.rc_context(PAPER_RC):
        plot.figure.savefig(paths[0], metadata={"CreationDate": None})
        plot.figure.savefig(paths[1])
    data_path = out_dir / f"{plot.name}_data.csv"
    data_path.write_text(to_csv(plot.data))
    return [*paths, data_path]


def _iqr(frame: pd.DataFrame, median: str, p25: str, p75: str) -> tuple[list[float], list[float]]:
    """Error bar lengths below and above the median."""
    return (list(frame[median] - frame[p25]), list(frame[p75] - frame[median]))


def annotate_failures(ax, failed: pd.DataFrame, x_column: str) -> None:
    """Failed points sit at their x above the axis as 'series: STATUS' (wrapped), never as a number;
    several at one x stack upwards. A text near either end of the x axis runs inwards from its x, so that it
    stays inside the axes."""
    placed = []  # (x, height as an axes fraction, text, colour)
    stacked: dict[float, float] = {}  # x -> the height (axes fraction) where the next text starts
    for row in failed.to_dict("records"):
        if is_missing(row[x_column]):
            continue
        text = wrap(f"{row['series']}: {row['failed']}", FAILURE_TEXT_WIDTH_PT, FAILURE_FONTSIZE)
        height = stacked.get(row[x_column], 0.03)
        stacked[row[x_column]] = height + 0.07 + 0.05 * text.count("\n")
        placed.append((row[x_column], height, text, arm_style(row["arm"])[0]))
    if stacked:  # widen the x axis to the failures' x without touching y
        y = ax.dataLim.y0 if math.isfinite(ax.dataLim.y0) else 0.0
        ax.update_datalim([(x, y) for x in stacked])
        ax.autoscale_view()
    at_bottom = blended_transform_factory(ax.transData, ax.transAxes)
    low, high = ax.get_xlim()
    for x, height, text, colour in placed:
        where = (x - low) / (high - low) if high > low else 0.5
        align = "right" if where > 0.7 else "left" if where < 0.3 else "center"
        ax.text(x, height, text, transform=at_bottom, fontsize=FAILURE_FONTSIZE, color=colour, ha=align,
                va="bottom", multialignment=align)


def _no_data(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} in this sweep", transform=ax.transAxes, ha="center", va="center")


def with_series(aggregated: pd.DataFrame, points_design: Design, leave_out) -> pd.DataFrame:
    frame = aggregated.copy()
    frame["series"] = [points_design.label(row, leave_out=leave_out) for row in frame.to_dict("records")]
    return frame


def data_rows(frame: pd.DataFrame, kind: str, x: str, y: str, low: list[float] | None = None,
               high: list[float] | None = None, scale: float = 1.0) -> pd.DataFrame:
    """What one series drew: y and its error bar ends (`low`/`high` = bar lengths), all divided by `scale`."""
    values = (frame[y] / scale).tolist()
    return pd.DataFrame({
        "series": frame["series"].tolist(), "kind": kind, "x": frame[x].astype(float).tolist(), "y": values,
        "y_low": [v - d / scale for v, d in zip(values, low)] if low is not None else math.nan,
        "y_high": [v + d / scale for v, d in zip(values, high)] if high is not None else math.nan,
        "status": [f or OK for f in frame["failed"]] if kind == "failed" else OK,
    })


def median_with_iqr(ax, frame: pd.DataFrame, series: str, kind: str, x: str, y: str, p25: str,
                     p75: str, style: SeriesStyle | None = None) -> pd.DataFrame:
    """One series as medians with p25-p75 error bars in its style (default: its arm's); returns what it drew."""
    style = style or SeriesStyle(*arm_style(frame["arm"].iloc[0]))
    low, high = _iqr(frame, y, p25, p75)
    ax.errorbar(frame[x], frame[y], yerr=[low, high], color=style.colour, marker=style.marker,
                markersize=style.markersize, linestyle=style.linestyle, zorder=style.zorder, label=series)
    return data_rows(frame, kind, x, y, low, high)


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
            _no_data(ax, "offload points")
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
            _no_data(ax, "offload points")
        ax.set_xlabel("memory budget (GB)")
        ax.set_ylabel("peak reserved (GB), final phase")
        legend_below(figure, ax)
    return Plot("peak_reserved_vs_budget", figure, concat_data(data))


def peak_reserved_with_spread(ax, frame: pd.DataFrame, series: str, x: str,
                              style: SeriesStyle | None = None) -> pd.DataFrame:
    """One series of final-phase peak reserved (GB) in its style (default: its arm's), bars from min to max over
    repeats; returns what it drew."""
    style = style or SeriesStyle(*arm_style(frame["arm"].iloc[0]))
    low = list(frame[PEAK_RESERVED] - frame[f"{PEAK_RESERVED}_min"])
    high = list(frame[f"{PEAK_RESERVED}_max"] - frame[PEAK_RESERVED])
    ax.errorbar(frame[x], frame[PEAK_RESERVED] / GB, yerr=[[v / GB for v in low], [v / GB for v in high]],
                color=style.colour, marker=style.marker, markersize=style.markersize, linestyle=style.linestyle,
                zorder=style.zorder, label=series)
    return data_rows(frame, "peak_reserved_gb", x, PEAK_RESERVED, low, high, scale=GB)


def _reference_rows(references: pd.DataFrame, value: str, scale: float = 1.0) -> pd.DataFrame:
    return pd.DataFrame({"series": references["series"].tolist(), "kind": "reference", "x": math.nan,
                         "y": (references[value] / scale).tolist(), "y_low": math.nan, "y_high": math.nan,
                         "status": OK})


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
        title = [f"{row['point']} / {row['against']}: {row['ratio']:.3f}× [{row['ci95_low']:.3f}, "
                 f"{row['ci95_high']:.3f}], {row['reads']}" for row in ratios.to_dict("records")]
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


def throughput_vs_micro_batch(points: pd.DataFrame) -> Plot:
    """Final-phase median tokens/s against micro-batch, one line per arm (and other design choices)."""
    p25, p75 = "final_tokens_per_s_p25", "final_tokens_per_s_p75"
    points_design = design(points)
    keys, on_axis = along_axis(points_design, points, "micro_batch")
    aggregated = with_series(aggregate_repeats(points, keys, [TOKENS_PER_S, p25, p75]), points_design, on_axis)
    data = []
    with mpl.rc_context(PAPER_RC):
        figure, ax = plt.subplots(figsize=(4.8, 3.2), layout="constrained")
        ok = aggregated[aggregated["n_ok"] > 0]
        for series, frame in ok.groupby("series", sort=False):
            data.append(median_with_iqr(ax, frame, series, "tokens_per_s", "micro_batch", TOKENS_PER_S, p25, p75))
        failed = aggregated[aggregated["n_ok"] == 0]
        annotate_failures(ax, failed, "micro_batch")
        data.append(data_rows(failed, "failed", "micro_batch", TOKENS_PER_S))
        ax.set_xlabel("micro-batch (sequences per GPU)")
        ax.set_ylabel("throughput (tokens/s), final phase")
        doubling_axis(ax, aggregated["micro_batch"])
        legend_below(figure, ax)
    return Plot("throughput_vs_micro_batch", figure, concat_data(data))


def doubling_axis(ax, swept: pd.Series) -> None:
    """A log-2 x axis ticked at the swept values: micro-batch and sequence-length sweeps double."""
    values = sorted(swept.dropna().unique())
    if values and values[0] > 0:
        ax.set_xscale("log", base=2)
    ax.set_xticks(values, [format_value(value) for value in values])
    ax.minorticks_off()


PANEL_WIDTH_IN = 3.3
PANEL_TITLE_FONTSIZE = 7
# A title centres on its axes, right of the y-axis labels: this wide it stays inside its own panel.
PANEL_TITLE_WIDTH_PT = PANEL_WIDTH_IN * 72 - 50
SERIES_UNITS = {"step_time_s": ("step time (s)", 1.0),
                "peak_reserved_bytes": ("peak reserved (GB)", GB),
                "peak_allocated_bytes": ("peak allocated (GB)", GB)}
LOG_SCALE_RATIO = 10  # compile steps can take 1000x a measured step; a log axis keeps both readable


def step_series(points: pd.DataFrame, steps: pd.DataFrame, metric: str = "step_time_s") -> Plot:
    """Per-step `metric` of every point, one panel each; compile steps hollow, phase boundaries dashed."""
    axis_label, scale = SERIES_UNITS[metric]
    with_steps = points.merge(steps[["sweep", "run_dir"]].drop_duplicates(), on=["sweep", "run_dir"]) \
        if not steps.empty else points.iloc[0:0]
    points_design = design(with_steps)  # the panels' points: a point without steps gets none
    # Panels in design order (arm, then its knobs, then repeat), not in the order the points ran.
    order = [key for key in [*points_design.keys, "repeat"] if key in with_steps]
    with_steps = with_steps.sort_values(order, key=order_key, kind="stable")
    columns = max(1, min(3, len(with_steps)))
    rows = max(1, math.ceil(len(with_steps) / columns))
    data = []
    with mpl.rc_context(PAPER_RC):
        figure, axes = plt.subplots(rows, columns, figsize=(PANEL_WIDTH_IN * columns, 2.4 * rows + 0.4),
                                    squeeze=False, layout="constrained")
        titles = _panel_titles(with_steps, points_design)
        for ax, point, title in zip(axes.flat, with_steps.to_dict("records"), titles):
            own = steps[(steps["sweep"] == point["sweep"]) & (steps["run_dir"] == point["run_dir"])]
            own = own.sort_values("step")
            values = own[metric].astype(float) / scale if metric in own else pd.Series(math.nan, index=own.index)
            colour, marker = arm_style(point["arm"])
            ax.plot(own["step"], values, color=colour, marker=marker, markersize=3)
            compile_steps = own["phase_step"] == 0
            ax.plot(own["step"][compile_steps], values[compile_steps], linestyle="none", marker=marker,
                    markersize=7, markerfacecolor="none", color=colour)
            for boundary in own.loc[(own["phase_step"] == 0) & (own["step"] > 0), "step"]:
                ax.axvline(boundary - 0.5, color="black", linestyle="--", linewidth=0.8)
            ax.set_title(wrap(title, PANEL_TITLE_WIDTH_PT, PANEL_TITLE_FONTSIZE), fontsize=PANEL_TITLE_FONTSIZE)
            ax.set_xlabel("step")
            ax.set_ylabel(axis_label)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if own["step"].max() - own["step"].min() < 1:  # one step: integer ticks need a unit of room around it
                ax.set_xlim(own["step"].min() - 1, own["step"].max() + 1)
            if values.notna().any() and values.min() > 0 and values.max() / values.min() > LOG_SCALE_RATIO:
                ax.set_yscale("log")
                ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))  # 0.2, 0.5, 1, 2, 5: room for each
                ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
                ax.yaxis.set_minor_formatter(NullFormatter())
            data.append(pd.DataFrame({"series": point["run_dir"], "x": own["step"].tolist(),
                                      "y": values.tolist(), "phase": own["phase"].tolist(),
                                      "phase_step": own["phase_step"].tolist()}))
        for ax in list(axes.flat)[len(with_steps):]:
            ax.set_visible(False)
        if with_steps.empty:
            axes.flat[0].set_visible(True)
            _no_data(axes.flat[0], "per-step records")
        data = concat_data(data)
        _step_key(figure, data)
    return Plot(f"{metric}_per_step", figure, data)


def _panel_titles(panels: pd.DataFrame, points_design: Design) -> list[str]:
    """Each panel's point: its label, its repeat where repeats vary, its status where it did not finish; panels
    that would still read the same (runs apart only in what defines no design point, an injected copy delay say)
    also name their run by its job number."""
    repeats_vary = "repeat" in panels and panels["repeat"].nunique() > 1
    records = panels.to_dict("records")
    titles = [points_design.label(point) + (f" #{point['repeat']}" if repeats_vary else "")
              + ("" if point["status"] == OK else f" [{point['status'].upper()}]") for point in records]
    return [f"{title} (run {job_order(point['run_dir'])[0]})" if titles.count(title) > 1 else title
            for title, point in zip(titles, records)]


def _step_key(figure: Figure, drawn: pd.DataFrame) -> None:
    """The key of what the panels drew, and of nothing they did not: compile steps (hollow), phase boundaries."""
    compiles = drawn["phase_step"] == 0 if "phase_step" in drawn else pd.Series(dtype=bool)
    entries = [(Line2D([], [], color="black", marker="o", markerfacecolor="none", linestyle="none"),
                "first step of a phase (compiles)", compiles.any()),
               (Line2D([], [], color="black", linestyle="--", linewidth=0.8),
                "phase boundary", (compiles & (drawn["x"] > 0)).any())]
    shown = [(handle, text) for handle, text, drawn_here in entries if drawn_here]
    if shown:
        handles, texts = zip(*shown)
        figure.legend(handles, texts, loc="outside lower center", ncols=len(shown), frameon=False)


def concat_data(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [frame for frame in frames if not frame.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["series", "kind", "x", "y", "y_low", "y_high", "status"])
