"""Throughput against the micro-batch: final-phase median tokens/s, one line per arm (and other design choices)."""
from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt
import pandas as pd

from analysis.design import along_axis, design
from analysis.layout import legend_below
from analysis.plots import (PAPER_RC, Plot, annotate_failures, concat_data, data_rows, doubling_axis,
                            median_with_iqr, with_series)
from analysis.tables import TOKENS_PER_S, aggregate_repeats


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


