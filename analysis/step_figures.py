"""Per-step figures (the report's diagnostics): one panel per point of a step field over its steps, compile steps
hollow, phase boundaries dashed."""
from __future__ import annotations

import math

import matplotlib as mpl
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FormatStrFormatter, LogLocator, MaxNLocator, NullFormatter

from analysis.design import Design, design
from analysis.layout import wrap
from analysis.load import GB, OK
from analysis.plots import PAPER_RC, Plot, arm_style, concat_data, no_data
from analysis.tables import order_key
from harness.contract.runfiles import job_order

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
            no_data(axes.flat[0], "per-step records")
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


