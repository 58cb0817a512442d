"""Micro-batch sizes at one global batch: points whose micro-batch and gradient accumulation vary together so that
micro-batch x accumulation (sequences per GPU per optimizer step) stays fixed, as in `experiments=accumulation`.

Per such global batch G: a table (`accumulation_<G>seq`) of each arm's final-phase median step time per optimizer
step, tokens/s, bytes offloaded per step and offload cycles per step (1: the states went out once per optimizer
step; the accumulation count: once per micro-batch) at every micro-batch, and a figure
(`accumulation_throughput_<G>seq`) of tokens/s against the micro-batch with an x where each arm first ran out, as
the capacity figure marks it. A sweep without such points gets neither.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from analysis.capacity import emulated_sizes, ladder_values, size_text, throughput_until_oom
from analysis.design import format_value, varies
from analysis.load import GB
from analysis.plots import Plot, save_plot
from analysis.render import write_table
from analysis.tables import STEP_TIME, TOKENS_PER_S, Table, axis_label, cell, display_frame, swept_values

AXIS = "micro_batch"
GLOBAL_BATCH = "global_batch"  # sequences per GPU per optimizer step
OFFLOADED = "final_offload_bytes_median"
CYCLES = "final_offload_cycles_median"
CELLS = {"s/step": (STEP_TIME, 1), "tok/s": (TOKENS_PER_S, 1), "offloaded/step (GB)": (OFFLOADED, GB),
         "cycles/step": (CYCLES, 1)}


def with_global_batch(points: pd.DataFrame) -> pd.DataFrame:
    return points.assign(**{GLOBAL_BATCH: points[AXIS] * points["grad_accum"]})


def global_batches(points: pd.DataFrame) -> list[int]:
    """The global batches at which the sweep compares micro-batches through accumulation (more than one
    accumulation count ran at it), smallest first."""
    if points.empty or "grad_accum" not in points:
        return []
    points = with_global_batch(points)
    return sorted(int(batch) for batch, rows in points.groupby(GLOBAL_BATCH) if varies(rows["grad_accum"]))


def points_at(points: pd.DataFrame, global_batch: int) -> pd.DataFrame:
    points = with_global_batch(points)
    return points[points[GLOBAL_BATCH] == global_batch].drop(columns=GLOBAL_BATCH).reset_index(drop=True)


def _column(micro_batch, global_batch: int) -> str:
    """'mb 2 (GA 8)': a micro-batch and the accumulation that makes up the global batch with it."""
    return f"{axis_label(AXIS, micro_batch)} (GA {global_batch // int(micro_batch)})"


def accumulation_table(points: pd.DataFrame, global_batch: int) -> Table:
    """Rows = arms (and their other knobs), column groups = micro-batches: s/step and tok/s per optimizer step,
    GB offloaded and offload cycles per optimizer step; a point that did not run shows how it ended."""
    values = ladder_values(points_at(points, global_batch), AXIS, more=[OFFLOADED, CYCLES])
    lines: dict[str, dict[tuple[str, str], str]] = {}
    for row in values.to_dict("records"):
        line = lines.setdefault(row["series"], {("", "arm"): row["series"]})
        for name, (value, scale) in CELLS.items():
            line[(_column(row[AXIS], global_batch), name)] = cell(row, value, scale)
    columns = [("", "arm")] + [(_column(value, global_batch), name) for value in swept_values(values[AXIS])
                               for name in CELLS]
    caption = (f"final-phase medians per optimizer step at {global_batch} sequences per GPU per optimizer step "
               "(micro-batch x gradient accumulation GA); cycles/step: how many times per optimizer step the "
               "offload pass sent the states out and back (1: once, GA: every micro-batch)")
    return Table(f"accumulation_{global_batch}seq", values.assign(**{GLOBAL_BATCH: global_batch}),
                 display_frame(list(lines.values()), columns), caption)


def accumulation_plot(points: pd.DataFrame, global_batch: int) -> Plot:
    """Tokens/s against the micro-batch at one global batch, an x at each arm's first OOM."""
    points = points_at(points, global_batch)
    sizes = emulated_sizes(points)
    device = f", emulated {size_text(sizes[0])} device" if len(sizes) == 1 else ""
    return throughput_until_oom(ladder_values(points, AXIS), AXIS, f"accumulation_throughput_{global_batch}seq",
                                f"Throughput at {global_batch} sequences per GPU per step{device}",
                                xlabel=f"micro-batch (gradient accumulation = {global_batch} / micro-batch)")


def write_accumulation_files(points: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """Per global batch: tables/accumulation_<G>seq.{md,tex,csv} and _values.csv, figures/
    accumulation_throughput_<G>seq (.pdf, .png, _data.csv)."""
    out_dir = Path(out_dir)
    paths: list[Path] = []
    for global_batch in global_batches(points):
        paths += write_table(accumulation_table(points, global_batch), out_dir / "tables")
        plot = accumulation_plot(points, global_batch)
        paths += save_plot(plot, out_dir / "figures")
        plt.close(plot.figure)
    return paths


def accumulation_lines(points: pd.DataFrame) -> list[str]:
    """What the report covers, one line per global batch, or the one line saying there is nothing to cover."""
    batches = global_batches(points)
    if not batches:
        return ["no micro-batches compared at one global batch (train.grad_accum varies with train.micro_batch): "
                "no accumulation table or figure"]
    return [f"accumulation at {format_value(batch)} sequences per GPU per optimizer step: "
            f"{len(points_at(points, batch))} point(s)" for batch in batches]
