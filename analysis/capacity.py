"""Capacity under an emulated device (`env.device_memory_gb`): which arm fits which sequence length (or
micro-batch), in the shape of DeepSpeed PR #8186's table, and where each arm stops fitting.

The builders take a sweep's points and one of its emulated sizes; `write_capacity_report` writes, for every
emulated size in a sweep, one table and two figures named by the size (`capacity_24gb`, ...), and nothing
for a sweep without one. Points on the real device (a null size) have no capacity to show and are left out.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib as mpl
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.transforms import blended_transform_factory, offset_copy

from analysis.design import along_axis, design, format_value, is_missing, varies
from analysis.layout import legend_below
from analysis.load import GB, OK, load_sweep
from analysis.plots import (PAPER_RC, Plot, SeriesStyle, annotate_failures, arm_style, concat_data, data_rows,
                            doubling_axis, median_with_iqr, peak_reserved_with_spread, save_plot, series_styles)
from analysis.render import write_table
from analysis.tables import (NOT_APPLICABLE, PEAK_RESERVED, STEP_TIME, TOKENS_PER_S, Table, aggregate_repeats,
                             axis_label, cell, display_frame, swept_axis, swept_values)
from harness.arms import arm_names

DEVICE_SIZE = "device_memory_gb"
CAPACITY_ARMS = arm_names(order=lambda arm: arm.display.capacity_order)  # PR #8186's row order
TOKENS_P25, TOKENS_P75 = "final_tokens_per_s_p25", "final_tokens_per_s_p75"
AXIS_TITLES = {"seq_len": "sequence length (tokens)", "micro_batch": "micro-batch (sequences per GPU)"}
AXIS_NAMES = {"seq_len": "sequence length", "micro_batch": "micro-batch"}
FITS = "largest that fits"
FIGURE_SIZE = (4.8, 3.2)  # inches, as the other figures; the legend under the axes adds its own height
OOM_MARKER = {"marker": "x", "markersize": 8, "markeredgewidth": 1.8, "linestyle": "none"}
OOM_MARKER_SPACING_PT = 9  # between the x's of series that ran out at one spot


def emulated_sizes(points: pd.DataFrame) -> list[float]:
    """The emulated device sizes (GB) of a sweep's points, smallest first; none for a sweep on real devices."""
    if DEVICE_SIZE not in points:
        return []
    return sorted(float(size) for size in points[DEVICE_SIZE].dropna().unique())


def points_of_size(points: pd.DataFrame, size: float) -> pd.DataFrame:
    return points[points[DEVICE_SIZE] == size].reset_index(drop=True)


def size_text(size: float) -> str:
    """'24 GB', '24.5 GB'."""
    return f"{format_value(size)} GB"


def outcome(point: Mapping[str, Any]) -> str:
    """How a point ended, an OOM with where it ran out: 'oom (p1)' (in phase 1), 'oom (build)' (before step
    0), plain 'oom' when its summary has no oom block; other statuses as they are."""
    if point["status"] != "oom":
        return point["status"]
    if point.get("oom_stage") == "build":
        return "oom (build)"
    phase = point.get("oom_phase")
    return "oom" if is_missing(phase) else f"oom (p{format_value(phase)})"


def ran_out(values: pd.DataFrame) -> pd.Series:
    """Per aggregated cell: no repeat ran, and at least one ran out of memory (the only status with OOM)."""
    return pd.Series([row["n_ok"] == 0 and "OOM" in row["failed"] for row in values.to_dict("records")],
                     index=values.index, dtype=bool)


def capacity_values(points: pd.DataFrame, size: float) -> tuple[pd.DataFrame, str]:
    """The points of one emulated size along their swept axis (ladder_values). Returns them and the axis."""
    points = points_of_size(points, size)
    axis = swept_axis(points)
    return ladder_values(points, axis), axis


def ladder_values(points: pd.DataFrame, axis: str, more: Sequence[str] = ()) -> pd.DataFrame:
    """One row per design point and ladder value (the swept axis): medians over the ok repeats of step time,
    tokens/s, peak reserved and the `more` columns, `failed` naming where OOM runs ran out, `series` the row label
    (keys that follow the axis left out, design.along_axis); arms in PR #8186's order."""
    points_design = design(points)
    keys, on_axis = along_axis(points_design, points, axis)
    points = points.assign(outcome=[outcome(point) for point in points.to_dict("records")])
    values = aggregate_repeats(points, keys, [STEP_TIME, TOKENS_PER_S, TOKENS_P25, TOKENS_P75, PEAK_RESERVED, *more],
                               outcome="outcome")
    values = values.sort_values("arm", key=lambda arms: arms.map(_arm_rank), kind="stable").reset_index(drop=True)
    values["series"] = [points_design.label(row, leave_out=on_axis) for row in values.to_dict("records")]
    return values


def _arm_rank(arm: str) -> tuple[int, str]:
    """PR #8186's arms in its order, other arms after them alphabetically."""
    return (CAPACITY_ARMS.index(arm), "") if arm in CAPACITY_ARMS else (len(CAPACITY_ARMS), str(arm))


def capacity_table(points: pd.DataFrame, size: float) -> Table:
    """Rows = arms (and their other knobs), columns = the ladder: final-phase median s/step, `OOM (pN)` where
    a point ran out in phase N, `OOM (build)` before step 0; last, the largest ladder value that ran ok."""
    values, axis = capacity_values(points, size)
    lines: dict[str, dict[tuple[str, str], str]] = {}
    for row in values.to_dict("records"):
        line = lines.setdefault(row["series"], {("", "arm"): row["series"]})
        line[("", axis_label(axis, row[axis]))] = cell(row, STEP_TIME)
    for series, rows in values.groupby("series", sort=False):
        fitting = rows.loc[rows["n_ok"] > 0, axis]
        lines[series][("", FITS)] = format_value(fitting.max()) if len(fitting) else NOT_APPLICABLE
    columns = [("", "arm"), *[("", axis_label(axis, value)) for value in swept_values(values[axis])], ("", FITS)]
    caption = (f"final-phase median s/step under an emulated {size_text(size)} device (env.device_memory_gb); "
               f"OOM (pN): ran out of memory in phase N, OOM (build): before step 0; {FITS}: the largest "
               f"{AXIS_NAMES.get(axis, axis)} that ran")
    return Table(f"capacity_{_size_suffix(size)}", values.assign(**{DEVICE_SIZE: size}),
                 display_frame(list(lines.values()), columns), caption)


def _size_suffix(size: float) -> str:
    return f"{format_value(size)}gb"


def frontier_plot(points: pd.DataFrame, size: float) -> Plot:
    """Final-phase median tokens/s against the ladder per arm, until each runs out (throughput_until_oom)."""
    values, axis = capacity_values(points, size)
    return throughput_until_oom(values, axis, f"capacity_frontier_{_size_suffix(size)}",
                                f"Throughput until out of memory, emulated {size_text(size)} device")


def throughput_until_oom(values: pd.DataFrame, axis: str, name: str, title: str, xlabel: str | None = None) -> Plot:
    """Final-phase median tokens/s (IQR bars) of ladder_values against the axis per series; an x in the arm's
    colour at its first OOM, level with its last point that ran (at the bottom when none ran)."""
    with mpl.rc_context(PAPER_RC):
        figure, ax = plt.subplots(figsize=FIGURE_SIZE, layout="constrained")
        data = _draw_ladder(ax, values, axis,
                            lambda ok, series, style: median_with_iqr(ax, ok, series, "tokens_per_s", axis,
                                                                      TOKENS_PER_S, TOKENS_P25, TOKENS_P75, style),
                            lambda ok, x: _last_below(ok, axis, x))
        _annotate_other_failures(ax, values, axis, data, TOKENS_PER_S)
        _finish(figure, ax, values, axis, "throughput (tokens/s), final phase", title, xlabel)
    return Plot(name, figure, concat_data(data))


def peak_reserved_plot(points: pd.DataFrame, size: float) -> Plot:
    """Final-phase peak reserved (GB, bars: min-max over repeats) against the ladder per arm, the emulated
    device as a line, an x on that line at each arm's first OOM."""
    values, axis = capacity_values(points, size)
    with mpl.rc_context(PAPER_RC):
        figure, ax = plt.subplots(figsize=FIGURE_SIZE, layout="constrained")
        data = _draw_ladder(ax, values, axis,
                            lambda ok, series, style: peak_reserved_with_spread(ax, ok, series, axis, style),
                            lambda ok, x: size)
        ax.axhline(size, color="black", linestyle="--", linewidth=0.8, label=f"emulated device ({size_text(size)})")
        data.append(pd.DataFrame({"series": ["emulated device"], "kind": "device", "x": math.nan, "y": size,
                                  "y_low": math.nan, "y_high": math.nan, "status": OK}))
        _annotate_other_failures(ax, values, axis, data, PEAK_RESERVED, scale=GB)
        _finish(figure, ax, values, axis, "peak reserved (GB), final phase",
                f"Peak reserved memory, emulated {size_text(size)} device")
    return Plot(f"capacity_peak_reserved_{_size_suffix(size)}", figure, concat_data(data))


def _draw_ladder(ax, values: pd.DataFrame, axis: str,
                 draw: Callable[[pd.DataFrame, str, SeriesStyle], pd.DataFrame],
                 oom_height: Callable[[pd.DataFrame, float], float | None]) -> list[pd.DataFrame]:
    """Per series: its cells that ran, by draw(rows, series, style), and an x at its first OOM at oom_height(rows
    that ran, x); returns what was drawn. Series of one arm differ by marker and line (series_styles)."""
    styles = series_styles(values)
    series_rows = [(series, rows, rows[rows["n_ok"] > 0]) for series, rows in values.groupby("series", sort=False)]
    first_ooms = [_first_oom(rows, axis, lambda x, ok=ok: oom_height(ok, x)) for _, rows, ok in series_rows]
    data = []
    for (series, rows, ok), first_oom, offset in zip(series_rows, first_ooms, _side_by_side(first_ooms)):
        if not ok.empty:
            data.append(draw(ok, series, styles[series]))
        if not first_oom.empty:
            _mark_first_oom(ax, first_oom.iloc[0], arm_style(rows["arm"].iloc[0])[0], offset)
        data.append(first_oom)
    return data


def _last_below(ok: pd.DataFrame, axis: str, x: float) -> float | None:
    """Tokens/s of the largest ladder value below x that ran, None when none did."""
    below = ok[ok[axis] < x].sort_values(axis)
    return float(below[TOKENS_PER_S].iloc[-1]) if len(below) else None


def _first_oom(rows: pd.DataFrame, axis: str, height: Callable[[float], float | None]) -> pd.DataFrame:
    """The smallest ladder value where the series ran out, at height(x) in data units (NaN: at the bottom of the
    axes), as a data row; none when it never ran out."""
    out = rows[ran_out(rows)].sort_values(axis)
    if out.empty:
        return pd.DataFrame()
    first = out.iloc[0]
    x, y = float(first[axis]), height(float(first[axis]))
    return pd.DataFrame({"series": [first["series"]], "kind": "first_oom", "x": x,
                         "y": math.nan if y is None else y, "y_low": math.nan, "y_high": math.nan,
                         "status": first["failed"]})


def _side_by_side(first_ooms: list[pd.DataFrame]) -> list[float]:
    """Each marker's horizontal offset in points: 0 alone, and markers at one spot (the device line, say) spread
    around it so that none hides another."""
    spots = [None if oom.empty else (oom["x"].iloc[0], format_value(oom["y"].iloc[0])) for oom in first_ooms]
    offsets = []
    for position, spot in enumerate(spots):
        sharing = [other for other, at in enumerate(spots) if at == spot] if spot is not None else [position]
        offsets.append((sharing.index(position) - (len(sharing) - 1) / 2) * OOM_MARKER_SPACING_PT)
    return offsets


def _mark_first_oom(ax, first_oom: pd.Series, colour: str, offset_pt: float) -> None:
    """An x in the arm's colour at its first OOM, `offset_pt` to the right of it; at the bottom of the axes when it
    has no height."""
    at_bottom = is_missing(first_oom["y"])
    transform = blended_transform_factory(ax.transData, ax.transAxes) if at_bottom else ax.transData
    if offset_pt:
        transform = offset_copy(transform, fig=ax.figure, x=offset_pt, units="points")
    ax.plot([first_oom["x"]], [0.04 if at_bottom else first_oom["y"]], color=colour, transform=transform,
            clip_on=not at_bottom, label="_nolegend_", **OOM_MARKER)


def _annotate_other_failures(ax, values: pd.DataFrame, axis: str, data: list[pd.DataFrame], y: str,
                             scale: float = 1.0) -> None:
    """Cells that failed other than by running out of memory, by their status as the other figures show them."""
    failed = values[(values["n_ok"] == 0) & ~ran_out(values)]
    annotate_failures(ax, failed, axis)
    data.append(data_rows(failed, "failed", axis, y, scale=scale))


def _finish(figure, ax, values: pd.DataFrame, axis: str, ylabel: str, title: str, xlabel: str | None = None) -> None:
    """Ladder ticks (also where only OOMs are), labels, the title, one legend below."""
    doubling_axis(ax, values[axis])
    ax.set_xlabel(xlabel or AXIS_TITLES.get(axis, axis))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if ran_out(values).any():
        ax.plot([], [], color="black", label="first OOM (ran out of memory)", **OOM_MARKER)
    legend_below(figure, ax)


def write_capacity_files(points: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """Per emulated size: tables/capacity_<N>gb.{md,tex,csv} and _values.csv, figures/capacity_frontier_<N>gb
    and capacity_peak_reserved_<N>gb (.pdf, .png, _data.csv). The text files are the same bytes for the
    same points; PDF and PNG bytes may change with matplotlib's version."""
    out_dir = Path(out_dir)
    paths: list[Path] = []
    for size in emulated_sizes(points):
        paths += write_table(capacity_table(points, size), out_dir / "tables")
        if not ladder_swept(points, size):
            continue
        for plot in (frontier_plot(points, size), peak_reserved_plot(points, size)):
            paths += save_plot(plot, out_dir / "figures")
            plt.close(plot.figure)
    return paths


def ladder_swept(points: pd.DataFrame, size: float) -> bool:
    """Whether the points of one emulated size climb a ladder of more than one value: with one, the table says
    all there is, and a figure would stack every arm at one x."""
    values, axis = capacity_values(points, size)
    return varies(values[axis])


def write_capacity_report(sweep_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """The capacity report of a sweep dir's run files (see write_capacity_files); [] without an emulated size."""
    return write_capacity_files(load_sweep(sweep_dir).points, out_dir)


def capacity_lines(points: pd.DataFrame) -> list[str]:
    """What the report covers, one line per emulated size, or the one line saying there is nothing to cover."""
    sizes = emulated_sizes(points)
    if not sizes:
        return ["no emulated device size (env.device_memory_gb) in this sweep: no capacity table or figures"]
    lines = [f"capacity at an emulated {size_text(size)}: {len(points_of_size(points, size))} point(s)"
             + ("" if ladder_swept(points, size) else ", at one ladder value: the table, no figures")
             for size in sizes]
    real = int(points[DEVICE_SIZE].isna().sum())
    return lines + ([f"left out {real} point(s) on the real device (no env.device_memory_gb)"] if real else [])
