"""Print the offload benchmark's ratios from one or more sweep dirs of arms run back to back.

    python -m analysis.bench SWEEP_DIR [SWEEP_DIR ...]

For each offload budget found: final-phase median step time of every arm, the reserved-memory trajectory of the
final phase with the allocator's retries in it, whether the point went over its budget ("over budget by 1.29 GB"),
and the largest relative loss difference against a `deepcompile` point like it (LIKE_KEYS: same model, shape,
accumulation, dtype and seed; where none ran, the line says so); for our pass also the copy stall per step and the
planner's predicted peak against the measured one. Points run on an emulated device (`env.device_memory_gb`) or
under an allocator ceiling (`env.reserved_cap_gb`) say so in their label, as do the design keys that tell the runs
of one arm apart, named as the report names them (`offload[train.sub_group_size=25000000]`, `ds_offload[repeat=1]`).
Then the comparisons, as the report's comparison table has them: our pass over DeepSpeed's (same workload and
limits, each pass at its own default budget or both at one, the line naming which where the sweep holds both) and
over DeepCompile without offload, each a ratio of medians over repeats with its 95% two-level bootstrap interval
(`0.701× [0.673, 0.756], n = 3×30 / 3×30`). Last, the device minutes every run took and the share of them spent in
measured steps, and what a point that reused the sweep's DeepCompile profiles cost against one that made them.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

import pandas as pd
import yaml

from analysis.columns import CONFIG_COLUMNS
from analysis.design import NAMING_COLUMNS, design, format_value
from analysis.load import combined, sweep_of
from harness.contract import reader, schema
from harness.contract.stats import ratio_text
from harness.contract.budget import recorded_over_budget_bytes
from harness.arms import BenchRole, known_class
from harness.contract.checks import is_finite_number, lookup
from harness.contract.envinfo import REPO_ROOT
from harness.contract.reader import Problem
from harness.contract.units import GB

KNOBS = schema.pass_knobs()  # our pass's, in the schema's order


LIMITS = ("device_memory_gb", "reserved_cap_gb")  # an emulated device size, an allocator ceiling inside it
KEY_OF_COLUMN = {column: key for key, column in CONFIG_COLUMNS.items()}  # a sweep frame's short column -> its key
# What a loss-parity reference shares with the point: the same model on the same batches in the same precision.
LIKE_KEYS = ("model.name", "train.seq_len", "train.micro_batch", "train.grad_accum", "train.dtype", "train.seed")


def load_points(sweep_dirs: list[Path], problems: list[Problem] | None = None) -> list[dict]:
    """Every readable point of the sweep dirs, through the one reader of run dirs (nothing a file names is
    imported); each unreadable file becomes one Problem in `problems`."""
    points = []
    for sweep_dir in sweep_dirs:
        files = reader.read_sweep(sweep_dir, known_class)
        if problems is not None:
            problems.extend(files.problems)
        points.extend(points_of(sweep_dir, files, sweep_of(sweep_dir, files).points))
    return points


def points_of(sweep_dir: Path, files: reader.SweepFiles, sweep_points: pd.DataFrame) -> list[dict]:
    """The points of one sweep's run files as the reader read them, each with its row of the loaded sweep
    (`sweep_points`, what the design reads)."""
    sweep_rows = {row["run_dir"]: row for row in sweep_points.to_dict("records")}
    points = []
    for point in files.points:
        config = point.config
        points.append({"arm": config["arm"]["name"], "role": bench_role(config),
                       "budget_gb": _number_or_none(lookup(config, "offload.budget_gb", None)),
                       "offload": _section(lookup(config, "offload", None)), "summary": point.summary,
                       "idle": idle_knobs(config),
                       "reserved_cap_gb": lookup(config, "env.reserved_cap_gb", None),
                       "device_memory_gb": lookup(config, "env.device_memory_gb", None),
                       "rows": point.steps, "run_dir": Path(sweep_dir) / point.run_dir,
                       "like": tuple(lookup(config, key, None) for key in LIKE_KEYS),
                       "sweep_row": sweep_rows[point.run_dir],
                       "over_budget_bytes": recorded_over_budget_bytes(point.summary, point.steps)})
    return points


def run_settings(points: list[dict]) -> dict[str, list[str]]:
    """Per arm, the design keys of the loaded sweep that tell its runs apart (analysis.design, repeats too), in label
    order, less those a label shows on terms of its own."""
    if not points:
        return {}
    shown = design(pd.DataFrame([point["sweep_row"] for point in points]), repeats=True).shown
    return {arm: [column for column in columns if not labelled_apart(column)] for arm, columns in shown.items()}


def labelled_apart(column: str) -> bool:
    """The offload group (our pass's knobs where they differ from the defaults; the budget heads each group) and the
    limits (named wherever set) label a point whether or not they vary. The sweep's name is left out: the design
    lists it wherever it varies, and only Design.label trims it to where the other keys leave runs alike."""
    key = KEY_OF_COLUMN.get(column, column)
    return key.startswith("offload.") or key in {f"env.{limit}" for limit in LIMITS} or column in NAMING_COLUMNS


def idle_knobs(config: dict) -> tuple[str, ...]:
    """The offload keys the point's arm reads but its other values left without effect (auto_rule beside a budget,
    say): a label leaves them out."""
    arm_class = known_class(config)
    return arm_class.idle_offload_keys(_section(lookup(config, "offload", None))) if arm_class is not None else ()


def _number_or_none(value):
    """A budget in GB, or None (auto) for a value that is none: groups are ordered by it."""
    return value if is_finite_number(value) else None


def _section(value) -> Mapping:
    return value if isinstance(value, Mapping) else {}


def bench_role(config: dict) -> str | None:
    """What the point's arm is in this benchmark (a BenchRole); None for an arm it does not compare, or one this
    checkout does not know."""
    arm_class = known_class(config)
    return arm_class.bench_role if arm_class is not None else None


def is_reference(point: dict) -> bool:
    """The point runs without offload: it belongs to every budget's group."""
    return point["role"] == BenchRole.REFERENCE


def final_stat(point: dict, name: str, stat: str) -> float | None:
    """A statistic of the final phase in the point's summary (`step_time_s`, `median`); None where it lacks it."""
    stats = (point["summary"].get("final") or {}).get(name)
    return stats.get(stat) if isinstance(stats, Mapping) else None


def final_median(point: dict) -> float | None:
    return final_stat(point, "step_time_s", "median")


def max_rel_loss_diff(rows: list[dict], reference: list[dict]) -> float | None:
    pairs = [(a.get("loss"), b.get("loss")) for a, b in zip(rows, reference)]
    pairs = [(a, b) for a, b in pairs if a is not None and b]  # a step without a loss compares nothing
    return max(abs(a - b) / abs(b) for a, b in pairs) if pairs else None


def reserved_trajectory_gb(point: dict) -> list[float]:
    final = (point["summary"].get("final") or {}).get("phase")
    return [round(r["peak_reserved_bytes"] / GB, 2) for r in point["rows"]
            if r["phase"] == final and r.get("peak_reserved_bytes") is not None]


def run_lengths(values: list[float]) -> str:
    """`[14.3, 14.4×91]`: consecutive equal values once, with their count (a 100-step run stays one line)."""
    runs: list[list] = []
    for value in values:
        if runs and runs[-1][0] == value:
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    return "[" + ", ".join(f"{value}" + (f"×{count}" if count > 1 else "") for value, count in runs) + "]"


def knob_defaults() -> dict:
    return yaml.safe_load((REPO_ROOT / "conf" / "offload" / "default.yaml").read_text())


def describe(point: dict, defaults: dict | None = None, varying: list[str] = ()) -> str:
    """The arm, the knobs of our pass that differ from the defaults and acted on the point, the allocator
    ceiling if one was set, and the `varying` settings (those that tell the arm's points apart)."""
    changed = []
    if point["role"] == BenchRole.OURS:
        defaults = knob_defaults() if defaults is None else defaults
        changed = [f"{k}={point['offload'][k]}" for k in KNOBS
                   if k in point["offload"] and point["offload"][k] != defaults.get(k)
                   and k not in point.get("idle", ())]
    changed += [f"{column}={format_value(point['sweep_row'].get(column))}" for column in varying]
    for limit in LIMITS:
        if point.get(limit) is not None:
            changed.append(f"{limit}={point[limit]}")
    return point["arm"] + (f"[{','.join(changed)}]" if changed else "")


def alloc_retries(point: dict) -> int | None:
    return final_stat(point, "alloc_retries", "sum")


def prediction_error(point: dict) -> float | None:
    """(predicted - measured) / measured peak allocated bytes, measured over the final phase's steps after its
    compile step (which also holds DeepCompile's profiling), for a point with a prediction."""
    summary = point["summary"]
    final = (summary.get("final") or {}).get("phase")
    measured = max((row["peak_allocated_bytes"] for row in point["rows"] if row["phase"] == final
                    and row.get("phase_step", 0) > 0 and row.get("peak_allocated_bytes") is not None), default=None)
    predicted = summary.get("predicted_peak_bytes")
    return (predicted - measured) / measured if predicted and measured else None


def stall_and_prediction(point: dict) -> str:
    """Our pass's copy stall per step (final-phase median) and its planner's peak prediction against the measured."""
    summary, parts = point["summary"], []
    stall = final_stat(point, "offload_stall_s", "median")
    if stall is not None:
        parts.append(f"copy stall {stall:.4f} s/step")
    error = prediction_error(point)
    if error is not None:
        parts.append(f"predicted peak {summary['predicted_peak_bytes'] / GB:.2f} GB ({error:+.1%} of measured)")
    return "".join(f" | {part}" for part in parts)


def gb_text(n_bytes) -> str:
    """Bytes as GB (1e9), as everywhere else the harness prints memory; '-' where there is no number."""
    return f"{n_bytes / GB:.2f} GB" if is_finite_number(n_bytes) else "-"


def like_reference(point: dict, points: list[dict]) -> dict | None:
    """The first ok reference point (no offload) that matches the point on LIKE_KEYS; None where none does."""
    return next((p for p in points if is_reference(p) and p is not point and p["summary"]["status"] == "ok"
                 and p["like"] == point["like"]), None)


def loss_parity(point: dict, points: list[dict]) -> str:
    """' | max rel loss diff vs deepcompile 1.00e-04', or where no reference point is like it, that there is none;
    nothing for a reference point itself."""
    if is_reference(point):
        return ""
    reference = like_reference(point, points)
    if reference is None:
        return " | loss parity: no reference of the same model, shape, accumulation, dtype and seed"
    loss = max_rel_loss_diff(point["rows"], reference["rows"])
    return f" | max rel loss diff vs {reference['arm']} {loss:.2e}" if loss is not None else ""


def over_budget_text(point: dict) -> str:
    over = point.get("over_budget_bytes")
    return f" | over budget by {gb_text(over)}" if over else ""


def report(points: list[dict]) -> str:
    lines = []
    varying = run_settings(points)
    for budget in sorted({p["budget_gb"] for p in points if not is_reference(p)}, key=lambda b: (b is None, b)):
        group = [p for p in points if p["budget_gb"] == budget or is_reference(p)]
        lines.append(f"== budget_gb={budget if budget is not None else 'auto'}")
        for p in group:
            median = final_median(p)
            lines.append(f"  {describe(p, varying=varying[p['arm']]):<48} {p['summary']['status']:<7} final median "
                         + (f"{median:.4f} s" if median is not None else "-") + over_budget_text(p)
                         + loss_parity(p, points)
                         + f" | planned offload {gb_text(p['summary'].get('planned_offload_bytes'))}"
                         + f" | alloc retries {alloc_retries(p)}" + stall_and_prediction(p)
                         + f"\n      final-phase peak reserved GB per step: {run_lengths(reserved_trajectory_gb(p))}")
    return "\n".join(lines)


def comparisons(sweep_dirs: list[Path]) -> str:
    """Our pass over the other arms, each ratio with its interval and how it reads (analysis/measurement.py)."""
    from analysis.load import load_sweeps

    return comparison_lines(load_sweeps(sweep_dirs))


def comparison_lines(sweep) -> str:
    """comparisons() of sweeps already loaded (analysis.load.Sweep)."""
    from analysis.measurement import comparison_table

    rows = comparison_table(sweep.points, sweep.steps).values.to_dict("records")
    lines = ["== step time of our pass over the others: ratio [95% interval], n = runs × measured steps"]
    lines += [f"  {row['point']} / {row['against']}{_footing_text(row)}: "
              f"{ratio_text(row['ratio'], row['ci95_low'], row['ci95_high'])}, n = {row['runs']}: {row['reads']}"
              for row in rows]
    return "\n".join(lines if rows else [])


def _footing_text(row: dict) -> str:
    """', (a) each pass at its own default': where the table names the footing of the budgets, and the line has one."""
    footing = row.get("budgets")
    return f", {footing}" if isinstance(footing, str) else ""


def device_time(sweep) -> str:
    """The sweeps' device minutes and the share of them in measured steps (analysis/wall_time.py)."""
    from analysis.wall_time import device_time_line

    return device_time_line(sweep.points, sweep.steps)


def main(argv: list[str] | None = None) -> int:
    """Exit status 0 when a point was read, 1 when none could be, 2 on bad usage (a sweep dir that is not one)."""
    parser = argparse.ArgumentParser(prog="harness bench", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dirs", nargs="+", type=Path)
    sweep_dirs = parser.parse_args(argv).sweep_dirs
    for sweep_dir in sweep_dirs:
        if not sweep_dir.is_dir():
            print(f"error: {sweep_dir}: not a directory", file=sys.stderr)
            return 2
    read = [(sweep_dir, reader.read_sweep(sweep_dir, known_class)) for sweep_dir in sweep_dirs]  # each sweep read once
    for _, files in read:
        for problem in files.problems:
            print(problem.line(), file=sys.stderr)
    loaded = [(sweep_dir, files, sweep_of(sweep_dir, files)) for sweep_dir, files in read]  # each sweep loaded once
    points = [point for sweep_dir, files, sweep in loaded for point in points_of(sweep_dir, files, sweep.points)]
    if not points:
        print(f"error: {', '.join(map(str, sweep_dirs))}: no readable points", file=sys.stderr)
        return 1
    sweep = combined([sweep for _, _, sweep in loaded])
    print("\n".join(filter(None, [report(points), comparison_lines(sweep), device_time(sweep)])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
