"""Text that fits its figure: labels wrapped at their ', ' to a width measured in the figure's font, and a
legend under the axes in as many columns as its labels fit, so that nothing is cut at the figure's edge."""
from __future__ import annotations

import matplotlib as mpl
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.textpath import text_to_path

SEPARATOR = ", "
LEGEND_COLUMNS = 2  # at most; fewer where the labels would not fit side by side
FIGURE_MARGIN_PT = 12  # constrained layout's padding at the figure's edges, and some slack


def text_width(text: str, fontsize: float) -> float:
    """Width in points of one line of text in the current font (the caller's rc context)."""
    width, _, _ = text_to_path.get_text_width_height_descent(text, FontProperties(size=fontsize), ismath=False)
    return width


def wrap(text: str, width_pt: float, fontsize: float) -> str:
    """Lines of whole 'key=value' parts, each at most width_pt wide; a part wider than that alone is cut,
    without a comma, where it reaches the width."""
    wrapped = ""
    for part in text.split(SEPARATOR):
        for position, piece in enumerate(_pieces(part, width_pt, fontsize)):
            last_line = wrapped.rpartition("\n")[2]
            if not wrapped:
                wrapped = piece
            elif position == 0 and text_width(f"{last_line}{SEPARATOR}{piece},", fontsize) <= width_pt:
                wrapped += SEPARATOR + piece
            else:
                wrapped += ("," if position == 0 else "") + "\n" + piece
    return wrapped


def _pieces(part: str, width_pt: float, fontsize: float) -> list[str]:
    """The part as it is where it fits, else cut into pieces that fit (at least one character each)."""
    if text_width(part + ",", fontsize) <= width_pt:
        return [part]
    pieces = [""]
    for char in part:
        if pieces[-1] and text_width(pieces[-1] + char + ",", fontsize) > width_pt:
            pieces.append("")
        pieces[-1] += char
    return pieces


def unwrap(text: str) -> str:
    """The label a wrapped text was made from."""
    return text.replace(",\n", SEPARATOR)


def legend_below(figure: Figure, *axes) -> None:
    """One legend of every handle of `axes`, under them (so that it never hides a point) and inside the
    figure's width: two columns where every label fits in one, else one column of wrapped labels. The
    figure grows by the legend's height, so that the axes keep theirs however long the legend."""
    handles, labels = [], []
    for ax in axes:
        more_handles, more_labels = ax.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    if not handles:
        return
    fontsize = FontProperties(size=mpl.rcParams["legend.fontsize"]).get_size_in_points()
    columns, width = _legend_columns(figure, labels, fontsize)
    legend = figure.legend(handles, [wrap(label, width, fontsize) for label in labels],
                           loc="outside lower center", ncols=columns, frameon=False)
    figure.set_figheight(figure.get_figheight() + legend.get_window_extent().height / figure.dpi)


def _legend_columns(figure: Figure, labels: list[str], fontsize: float) -> tuple[int, float]:
    """The most columns (up to LEGEND_COLUMNS) whose text width holds every label, and that width."""
    rc = mpl.rcParams
    handle = (rc["legend.handlelength"] + rc["legend.handletextpad"]) * fontsize
    spacing = rc["legend.columnspacing"] * fontsize
    available = figure.get_figwidth() * 72 - FIGURE_MARGIN_PT - 2 * rc["legend.borderpad"] * fontsize

    def width(columns: int) -> float:
        return (available - (columns - 1) * spacing) / columns - handle

    for columns in range(LEGEND_COLUMNS, 1, -1):
        if all(text_width(label, fontsize) <= width(columns) for label in labels):
            return columns, width(columns)
    return 1, width(1)
