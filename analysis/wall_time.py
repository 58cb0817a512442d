"""Where a campaign's device time went: `wall_time_table`, per design point, a run's wall time in three parts that
sum to it (the phases' first steps, the other steps, the rest), the share of the device time its measured steps
took, and, where runs recorded their wall split (analysis/wall_split.py), what the first steps and the rest were
made of and how many of DeepCompile's profiling runs were reused; `device_time_line`, the campaign's device minutes
and measured share in one line (`harness bench`)."""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd

from analysis.design import design, is_missing
from analysis.measurement import _design_points, measured_steps
from analysis.tables import NOT_APPLICABLE, Table, display_frame
from analysis.wall_split import FIRST_STEP_COLUMNS, REST_COLUMNS
from harness.contract.statuses import SKIPPED

WALL_PARTS = ("compile_s", "steps_s", "other_s")  # a run's wall time in three parts that sum to it


def wall_parts(point: Mapping[str, Any], run: pd.DataFrame) -> dict[str, float | None]:
    """Where one run's wall time went: the phases' first steps (the compile steps; an eager arm's first step), every
    other step, and the rest (torchrun, the rank's start-up, machine readings, teardown); of the rest, the rank's
    start-up (imports, model, engine), null in runs recorded before worker.json had it."""
    wall = point.get("wall_time_s")
    startup = None if is_missing(point.get("startup_s")) else float(point["startup_s"])
    if is_missing(wall):
        return {"wall_time_s": None, **dict.fromkeys(WALL_PARTS), "startup_s": startup}
    first = run["phase_step"] == 0
    compile_s, steps_s = float(run.loc[first, "step_time_s"].sum()), float(run.loc[~first, "step_time_s"].sum())
    return {"wall_time_s": float(wall), "compile_s": compile_s, "steps_s": steps_s,
            "other_s": float(wall) - compile_s - steps_s, "startup_s": startup}


def _steps_by_run(steps: pd.DataFrame) -> Callable[[Mapping[str, Any]], pd.DataFrame]:
    """A point -> its steps (every step of the last attempt: a re-run point's earlier attempts, under attempts/N/,
    are not read; none for a point that ran out before its first step), the sweep's steps grouped once."""
    by_run = dict(iter(steps.groupby(["sweep", "run_dir"]))) if not steps.empty else {}
    empty = pd.DataFrame({"phase_step": pd.Series(dtype=int), "step_time_s": pd.Series(dtype=float)})
    return lambda point: by_run.get((point["sweep"], point["run_dir"]), empty)


def _seconds(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None and not is_missing(value)]
    return float(pd.Series(present).median()) if present else None


def _measured_seconds(points: pd.DataFrame, steps: pd.DataFrame) -> Callable[[Mapping[str, Any]], float]:
    """A run -> the seconds of its measured steps (0 for a run that is not ok: it measured nothing)."""
    measured = {run: float(rows["step_time_s"].sum()) for run, rows in measured_steps(points, steps).items()}
    return lambda point: measured.get((point["sweep"], point["run_dir"]), 0.0)


def _share(measured_s: float, wall_s: float) -> float | None:
    return 100 * measured_s / wall_s if wall_s > 0 else None


WALL_TITLES = {"compile_s": "first steps (s)", "steps_s": "other steps (s)", "other_s": "rest (s)",
               "startup_s": "of it start-up (s)", "wall_time_s": "wall (s)"}
# The split's columns, shown where a run of the table recorded one: after the first steps, the parts of them; after
# the start-up, its parts and teardown.
FIRST_STEP_TITLES = dict(zip(FIRST_STEP_COLUMNS, ("trace (s)", "inductor (s)", "DC profiling (s)", "DC other (s)",
                                                   "ours (s)")))
REST_TITLES = dict(zip(REST_COLUMNS, ("imports (s)", "model (s)", "engine (s)", "torchrun + end (s)")))
REUSED = ("", "profiles reused")


def _columns(with_split: bool) -> list[tuple[str, str]]:
    titles = list(WALL_TITLES.values())
    if with_split:
        titles[1:1] = FIRST_STEP_TITLES.values()  # after the first steps
        at = titles.index(WALL_TITLES["startup_s"]) + 1
        titles[at:at] = REST_TITLES.values()
    tail = [REUSED] if with_split else []
    return [("", "arm"), ("", "runs"), *(("", title) for title in titles), ("", "device (min)"),
            ("", "measured (%)"), *tail]


def _tenths(value: float | None) -> str:
    return NOT_APPLICABLE if value is None else f"{value:.1f}"


def _by_phase(cells: Sequence[Any]) -> list[float | None]:
    """The median over runs of each phase's DeepCompile profiling seconds."""
    lists = [json.loads(cell) for cell in cells if isinstance(cell, str)]
    phases = max((len(values) for values in lists), default=0)
    return [_seconds([values[phase] for values in lists if phase < len(values)]) for phase in range(phases)]


def _split_values(group: pd.DataFrame) -> dict[str, Any]:
    """The split's medians over the point's runs, the profiling per phase, and the profiling runs reused (summed)."""
    values = {name: _seconds(group[name].tolist()) for name in (*FIRST_STEP_TITLES, *REST_TITLES)}
    values["split_dc_profiling_by_phase"] = _by_phase(group["split_dc_profiling_by_phase"].tolist())
    looked_up = group["profiles_looked_up"].dropna()
    values["profiles_reused"] = int(group["profiles_reused"].dropna().sum()) if len(looked_up) else None
    values["profiles_looked_up"] = int(looked_up.sum()) if len(looked_up) else None
    return values


def _split_cells(values: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    cells = {("", title): _tenths(values[name]) for name, title in {**FIRST_STEP_TITLES, **REST_TITLES}.items()}
    by_phase = values["split_dc_profiling_by_phase"]
    if len(by_phase) > 1:  # each phase's, as the compile steps run them
        cells[("", FIRST_STEP_TITLES["split_dc_profiling_s"])] = " + ".join(map(_tenths, by_phase))
    if values["profiles_looked_up"] is not None:
        cells[REUSED] = f"{values['profiles_reused']}/{values['profiles_looked_up']}"
    return cells


def wall_time_table(points: pd.DataFrame, steps: pd.DataFrame) -> Table:
    """Per design point, where a run's wall time went (each part the median over its runs that started, every
    status: a run that ran out still used the device), the device minutes all its runs took and the share of them
    in measured steps; a last line sums the campaign. The split's columns appear where a run recorded one."""
    rows, lines = [], []
    points_design, steps_of, measured_of = design(points), _steps_by_run(steps), _measured_seconds(points, steps)
    with_split = any(points[name].notna().any() for name in (*FIRST_STEP_COLUMNS, *REST_COLUMNS) if name in points)
    for row, group in _design_points(points, points_design):
        label = points_design.label(row)
        ran = group[group["status"] != SKIPPED]  # a point kept from starting used no device time
        runs = ran.to_dict("records")  # every run that started, whatever its status: one that ran out used the device
        parts = [wall_parts(point, steps_of(point)) for point in runs]
        medians = {name: _seconds([part[name] for part in parts]) for name in WALL_TITLES}
        wall_s = sum(part["wall_time_s"] or 0.0 for part in parts)
        measured_s = sum(measured_of(point) for point in runs)
        values = {**medians, "device_min": wall_s / 60, "measured_s": measured_s,
                  "measured_pct": _share(measured_s, wall_s)}
        skipped = len(group) - len(ran)
        line = {("", "arm"): label, ("", "runs"): f"{len(ran)}" + (f" (+{skipped} skipped)" if skipped else ""),
                **{("", title): _tenths(medians[name]) for name, title in WALL_TITLES.items()},
                ("", "device (min)"): _tenths(values["device_min"]),
                ("", "measured (%)"): _tenths(values["measured_pct"])}
        if with_split:
            split = _split_values(ran)
            values.update(split)
            line.update(_split_cells(split))
        rows.append({**row, "n_runs": len(ran), **values})
        lines.append(line)
    total_min, total_measured = sum(row["device_min"] for row in rows), sum(row["measured_s"] for row in rows)
    lines.append({("", "arm"): "all points", ("", "runs"): str(sum(row["n_runs"] for row in rows)),
                  ("", "device (min)"): _tenths(total_min),
                  ("", "measured (%)"): _tenths(_share(total_measured, total_min * 60))})
    return Table("wall_time", pd.DataFrame(rows), display_frame(lines, _columns(with_split)),
                 caption=_caption(with_split))


def _caption(with_split: bool) -> str:
    caption = ("Where each point's wall time went, each part the median over its runs of every status but skipped ("
               "a point sweep.stop_at kept from starting ran nothing; so the parts of a point with several runs need "
               "not add up): the phases' first steps (the compile steps; an eager arm's first step), the other "
               "steps, and the rest (torchrun, the rank's start-up, machine readings, teardown), of which the "
               "start-up ('-' in runs recorded before it was); device (min): all runs of the point together, and of "
               "the campaign on the last line (a re-run point's earlier attempts not counted); measured (%): the "
               "share of those minutes spent in the final phase's measured steps.")
    if not with_split:
        return caption
    return caption + (" Of the first steps (summed over phases): trace, Dynamo and AOT tracing; inductor, its code "
                      "generation and builds; DC profiling, DeepCompile's profiling runs (each phase's where there "
                      "are several); DC other, the rest of DeepCompile's passes; ours, our pass's profile and plan. "
                      "Of the rest: imports (and the process group), the model under zero.Init, the engine and "
                      "compile set-up, and torchrun's own start and end with the worker's after its last step. "
                      "profiles reused: DeepCompile's profiling runs taken from the sweep's cache of all looked up "
                      "(sweep.reuse). '-': not recorded (runs before the split, or a timer this torch lacks).")


def device_time_line(points: pd.DataFrame, steps: pd.DataFrame) -> str:
    """`harness bench`'s line: the runs' device minutes and the share of them in measured steps."""
    walls = [0.0 if is_missing(wall) else float(wall) for wall in points["wall_time_s"]] if len(points) else []
    measured_of = _measured_seconds(points, steps)
    measured = sum(measured_of(point) for point in points.to_dict("records"))
    share = _share(measured, sum(walls))
    return (f"== device time: {sum(walls) / 60:.1f} min over {len(walls)} runs, "
            f"{_tenths(share)}% of it in measured steps" + reuse_text(points))


def reuse_text(points: pd.DataFrame) -> str:
    """'; a point that reused DeepCompile's profiles took 0.77× the wall of one that made them (median 49.3 s over 4
    runs, against 64.5 s over 1)': the sweep-cost reading, where its ok runs hold both kinds; '' otherwise."""
    if "profiles_reused" not in points or not len(points):
        return ""
    ok = points[(points["status"] == "ok") & points["profiles_looked_up"].fillna(0).gt(0)
                & points["wall_time_s"].notna()]
    reused = ok[ok["profiles_reused"].gt(0)]["wall_time_s"].astype(float)
    made = ok[ok["profiles_reused"].eq(0)]["wall_time_s"].astype(float)
    if not len(reused) or not len(made):
        return ""
    return (f"; a point that reused DeepCompile's profiles took {reused.median() / made.median():.2f}× the wall of one "
            f"that made them (median {reused.median():.1f} s over {len(reused)} runs, against {made.median():.1f} s "
            f"over {len(made)})")
