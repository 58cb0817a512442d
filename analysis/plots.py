"""What every paper figure shares: one fixed colour and marker per arm in every figure, the paper's fonts, labelled
axes with units, IQR error bars, failed points named by their status above the axis. Each builder (budget_figures.py,
throughput_figures.py, comparison_figures.py, step_figures.py, capacity.py, accumulation.py) returns a `Plot`
holding the figure and the tidy data it drew, so the data can be saved beside the figure and compared between
runs."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib as mpl
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.transforms import blended_transform_factory

from analysis.design import Design, format_value, is_missing
from analysis.layout import wrap
from analysis.load import GB, OK
from analysis.render import to_csv
from analysis.tables import PEAK_RESERVED
from harness.arms import Arm, registered

# Each arm's colour and marker (harness/arms/), so arms stay apart in greyscale too.
ARM_STYLES = {name: (arm.display.colour, arm.display.marker) for name, arm in registered().items()}
OTHER_ARM_STYLE = (Arm.display.colour, Arm.display.marker)
# A second and later series of one arm keeps its colour and takes the next of these markers and line styles, so
# series of one arm stay apart (one-point series by their marker); none is another arm's marker, and dashed and
# dotted lines are left to the offloaded twin and the references.
MORE_MARKERS = ("*", "P", "h", "<", ">", "p", "d")  # no "x"/"X": an x marks a first OOM
MORE_LINESTYLES = ("-.", (0, (5, 1, 1, 1, 1, 1)), "-")
MORE_MARKER_SIZE = 7  # these markers fill less of their box than the arms' own
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


def no_data(ax, what: str) -> None:
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


def doubling_axis(ax, swept: pd.Series) -> None:
    """A log-2 x axis ticked at the swept values: micro-batch and sequence-length sweeps double."""
    values = sorted(swept.dropna().unique())
    if values and values[0] > 0:
        ax.set_xscale("log", base=2)
    ax.set_xticks(values, [format_value(value) for value in values])
    ax.minorticks_off()


def concat_data(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [frame for frame in frames if not frame.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["series", "kind", "x", "y", "y_low", "y_high", "status"])
