"""Reused against cold (`sweep.reuse`): a point that took its sweep's DeepCompile profiles must run as the same point
made cold does: the same plan (the bytes it offloads), the same predicted peak, and a step time whose ratio to the
cold one's has a 95% interval holding 1. Table `reuse_check`, per pair of design points of one arm that differ only
in `sweep.reuse` (repeats aside), the reused one having reused profiles; empty where a sweep holds no such pair, and
then left out of the report (a pair comes from experiments/budget_sweep.yaml's cold run).
"""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from analysis.design import design, format_value
from analysis.measurement import context, runs_by_design_point
from analysis.tables import NOT_APPLICABLE, Table, display_frame
from harness.contract import stats
from harness.contract.units import GB

REUSE = "sweep.reuse"
PLAN_COLUMNS = ("planned_offload_bytes", "predicted_peak_bytes")  # what a reused point must plan as a cold one


def _one(group: pd.DataFrame, column: str) -> float | None:
    """The value every run of a design point recorded, None where they differ or none did."""
    values = set(group[column].dropna()) if column in group else set()
    return values.pop() if len(values) == 1 else None


def _reused(group: pd.DataFrame) -> bool:
    return bool(group.get("profiles_reused", pd.Series(dtype=float)).fillna(0).gt(0).all())


def reuse_pairs(points: pd.DataFrame, steps: pd.DataFrame) -> list[tuple[tuple, tuple]]:
    """(reused, cold) design points, each (row, label, group, runs): one arm, every design key equal but sweep.reuse,
    the reused one with profiles taken from the sweep's cache in every run."""
    if REUSE not in points:
        return []
    keys = [key for key in design(points).keys if key != REUSE]
    design_points = runs_by_design_point(points, steps)
    reused = [point for point in design_points if format_value(point[0].get(REUSE)) == "True" and _reused(point[2])]
    cold = [point for point in design_points if format_value(point[0].get(REUSE)) == "False"]
    return [(point, base) for point in reused for base in cold if context(point[0], keys) == context(base[0], keys)]


def _gb_pair(values: Sequence[float | None]) -> str:
    return " / ".join(NOT_APPLICABLE if value is None else f"{value / GB:.3f}" for value in values)


def _reading(same_plan: bool, ratio: stats.Ratio | None) -> str:
    if not same_plan:
        return "differs: plan"
    if ratio is None:
        return NOT_APPLICABLE
    return "matches" if ratio.verdict == "no difference" else f"differs: step time ({ratio.verdict})"


def reuse_check_table(points: pd.DataFrame, steps: pd.DataFrame) -> Table:
    """Per (reused, cold) pair: each one's offloaded bytes and predicted peak, the step-time ratio reused / cold with
    its 95% two-level bootstrap interval, and whether the reused point matches the cold one."""
    rows, lines = [], []
    for (row, label, group, runs), (_, base_label, base_group, base_runs) in reuse_pairs(points, steps):
        plan = {column: (_one(group, column), _one(base_group, column)) for column in PLAN_COLUMNS}
        same_plan = all(reused is not None and reused == cold for reused, cold in plan.values())
        ratio = stats.ratio_interval(runs, base_runs)
        rows.append({"point": label, "against": base_label,
                     **{f"{column}_{side}": value for column, pair in plan.items()
                        for side, value in zip(("reused", "cold"), pair)},
                     "same_plan": same_plan, "ratio": ratio and ratio.ratio, "ci95_low": ratio and ratio.low,
                     "ci95_high": ratio and ratio.high, "runs": ratio and ratio.sizes,
                     "reading": _reading(same_plan, ratio)})
        lines.append({("", "reused"): label, ("", "cold"): base_label,
                      ("", "offloaded (GB)"): _gb_pair(plan["planned_offload_bytes"]),
                      ("", "predicted peak (GB)"): _gb_pair(plan["predicted_peak_bytes"]),
                      ("", "step time ratio"): NOT_APPLICABLE if ratio is None else f"{ratio.ratio:.3f}×",
                      ("", "95% interval"): NOT_APPLICABLE if ratio is None
                      else stats.interval_text(ratio.low, ratio.high),
                      ("", "runs × steps"): NOT_APPLICABLE if ratio is None else ratio.sizes,
                      ("", "reads"): _reading(same_plan, ratio)})
    return Table("reuse_check", pd.DataFrame(rows), display_frame(lines),
                 caption="A point that reused its sweep's DeepCompile profiles (sweep.reuse) against the same point "
                         "run cold: offloaded bytes and predicted peak (reused / cold), and the step time of the "
                         "reused over the cold one with a 95% bootstrap interval over runs, then steps. It matches "
                         "where the plan and peak are equal and the interval holds 1.")
