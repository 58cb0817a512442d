"""Why the allocator retried: per design point whose runs traced a step or a window of steps
(`debug.memory_trace_step`, `debug.memory_trace_steps`), the traced steps' retries pooled over its runs, and the
share of those the trace lists that each reading explains (harness/contract/retry_trace.py: deferred frees,
fragmentation of the request's stream, another stream's cache, no headroom under the limit), with the largest
request that missed. Table `retry_causes`; a sweep without a traced step gets none.
"""
from __future__ import annotations

import pandas as pd

from analysis.columns import (TRACED_FREE_AT_MISS, TRACED_LARGEST_MISS, TRACED_LISTED, TRACED_READING_COLUMNS,
                              TRACED_RETRIES)
from analysis.design import design
from analysis.load import GB
from analysis.tables import Table, display_frame, format_number, order_key

READING_TITLES = {"deferred": "deferred", "fragmentation": "fragmentation", "other_stream": "other stream",
                  "headroom": "headroom"}


def has_retry_traces(points: pd.DataFrame) -> bool:
    return TRACED_RETRIES in points and points[TRACED_RETRIES].notna().any()


def retry_cause_values(traced: pd.DataFrame) -> dict:
    """The traced runs of one design point pooled: retries in all and listed, each reading's count and share of the
    listed ones (None where none is listed), the largest missed request."""
    listed = int(traced[TRACED_LISTED].sum())
    counts = {reading: int(traced[column].sum()) for reading, column in TRACED_READING_COLUMNS.items()}
    largest = traced.dropna(subset=[TRACED_LARGEST_MISS]).sort_values(TRACED_LARGEST_MISS, kind="stable")
    at_largest = largest.iloc[-1] if len(largest) else None
    free = None if at_largest is None else at_largest.get(TRACED_FREE_AT_MISS)
    return {"traced_runs": len(traced), "retries": int(traced[TRACED_RETRIES].sum()), "listed": listed,
            **{f"{reading}_retries": count for reading, count in counts.items()},
            **{f"{reading}_share": count / listed if listed else None for reading, count in counts.items()},
            "largest_miss_bytes": None if at_largest is None else float(at_largest[TRACED_LARGEST_MISS]),
            "free_at_largest_miss_bytes": None if free is None or pd.isna(free) else float(free)}


def _cells(values: dict) -> dict[tuple[str, str], str]:
    shares = {("", title): "-" if values[f"{reading}_share"] is None
              else f"{values[f'{reading}_share']:.0%}" for reading, title in READING_TITLES.items()}
    gigabytes = {name: "-" if values[key] is None else format_number(values[key] / GB)
                 for name, key in (("largest miss (GB)", "largest_miss_bytes"),
                                   ("largest free block then (GB)", "free_at_largest_miss_bytes"))}
    return {("", "traced runs"): str(values["traced_runs"]), ("", "retries"): str(values["retries"]),
            ("", "listed"): str(values["listed"]), **shares, **{("", name): cell for name, cell in gigabytes.items()}}


def retry_cause_table(points: pd.DataFrame) -> Table:
    """One row per design point with a traced step, in the tables' order."""
    traced = points[points[TRACED_RETRIES].notna()]
    points_design = design(traced)
    keys = points_design.keys
    groups = [(dict(zip(keys, key)), group) for key, group in traced.groupby(keys, dropna=False, sort=False)]
    order = pd.DataFrame([row for row, _ in groups], columns=keys).sort_values(keys, key=order_key, kind="stable")
    rows, lines = [], []
    for row, group in (groups[position] for position in order.index):
        values = retry_cause_values(group)
        rows.append({**row, **values})
        lines.append({("", "arm"): points_design.label(row), **_cells(values)})
    return Table("retry_causes", pd.DataFrame(rows), display_frame(lines),
                 caption="The traced steps of each run (debug.memory_trace_step, and as many as "
                         "debug.memory_trace_steps from it; not measured steps), its runs pooled: allocator retries "
                         "in all, those memory_trace.json lists (at most 20 a trace) and the share of the listed "
                         "ones each reading explains (one column each): deferred (record_stream frees not yet "
                         "reusable would have held the request), fragmentation (its own stream's free cache would "
                         "have, in no block large enough), other stream (only all streams' free cache together "
                         "would have), headroom (the live bytes left too little room under the limit). Largest "
                         "miss: the largest request that missed; largest free block then: the largest free block "
                         "its stream had at that miss ('-' in traces from before that record).")
