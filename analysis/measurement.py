"""How each point was measured, and what comparisons between arms can claim.

`measurement_table`: per design point, its runs, their measured steps, the median over runs of each run's median
with a 95% bootstrap interval, the spread between repeats, and what makes it suspect (too few measured steps, an
unsteady run, the machine). `comparison_table`: our pass over DeepSpeed's pass at one workload, each at its own
default budget or both at one (peer_footing), over DeepCompile without offload at one workload, and composed with
DeepCompile's speed passes over alone, as a ratio of those medians with a two-level bootstrap interval
(harness/contract/stats.py); an interval that holds 1 reads "no difference". What the allocator's retries cost
per design point is analysis/retries.py's, where the device time went analysis/wall_time.py's.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from analysis.design import Design, budget_name, design, format_value, given_budget, is_missing
from analysis.load import OK
from analysis.tables import RESERVED_GROWTH, WORKLOAD_COLUMNS, NOT_APPLICABLE, Table, display_frame, failed_statuses, \
    format_number, order_key
from harness.contract import stats
from harness.arms import BenchRole, arm_names

MIN_MEASURED = 20  # the protocol's least measured steps per run for a number that backs a claim
REPEATS_AGREE = 0.03  # repeats of a point whose run medians lie further apart than this are flagged
LIMIT_COLUMNS = ("env.reserved_cap_gb",)  # an allocator ceiling inside the (emulated) device, where swept
COMPOSE = "compose"  # offload.compose's column: DeepCompile's speed passes composed with our pass


def measured_steps(points: pd.DataFrame, steps: pd.DataFrame) -> dict[tuple[str, str], pd.DataFrame]:
    """(sweep, run_dir) -> the rows of an ok point's measured final-phase steps: past the compile step and the
    point's warm-up steps (none in runs recorded before the protocol), not slowed by a debug trace."""
    if steps.empty:
        return {}
    traced = steps["traced"].fillna(False).astype(bool) if "traced" in steps else False
    out = {}
    for point in points[points["status"] == OK].to_dict("records"):
        warmup = 0 if is_missing(point.get("warmup_steps")) else int(point["warmup_steps"])
        out[(point["sweep"], point["run_dir"])] = steps[
            (steps["sweep"] == point["sweep"]) & (steps["run_dir"] == point["run_dir"])
            & (steps["phase"] == point["final_phase"]) & (steps["phase_step"] > warmup) & ~traced]
    return out


def with_reserved_growth(points: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """The points with RESERVED_GROWTH: how far peak reserved memory rose from an ok run's first measured step to
    its last (the cache an empty_cache policy lets grow; NaN where fewer than two measured steps recorded it)."""
    runs = measured_steps(points, steps)
    growth = [_reserved_growth(runs.get((point["sweep"], point["run_dir"]))) for point in points.to_dict("records")]
    return points.assign(**{RESERVED_GROWTH: growth})


def _reserved_growth(run: pd.DataFrame | None) -> float:
    reserved = [] if run is None or "peak_reserved_bytes" not in run else run["peak_reserved_bytes"].dropna()
    return float(reserved.iloc[-1] - reserved.iloc[0]) if len(reserved) >= 2 else math.nan


def _times(run: pd.DataFrame) -> list[float]:
    return run["step_time_s"].astype(float).tolist()


def _design_points(points: pd.DataFrame, points_design: Design) -> list[tuple[dict, pd.DataFrame]]:
    """(a representative row, the runs) per design point, in the tables' order."""
    keys = points_design.keys
    groups = [(dict(zip(keys, key)), group) for key, group in points.groupby(keys, dropna=False, sort=False)]
    order = pd.DataFrame([row for row, _ in groups], columns=keys).sort_values(keys, key=order_key, kind="stable")
    return [groups[position] for position in order.index]


def _runs(group: pd.DataFrame, measured: Mapping[tuple[str, str], pd.DataFrame]) -> list[pd.DataFrame]:
    ok = group[group["status"] == OK]
    return [measured[(sweep, run_dir)] for sweep, run_dir in zip(ok["sweep"], ok["run_dir"])
            if (sweep, run_dir) in measured]


def steps_by_design_point(points: pd.DataFrame, steps: pd.DataFrame) -> list[tuple[dict, str, pd.DataFrame,
                                                                                     list[pd.DataFrame]]]:
    """Per design point, in the tables' order: a representative row, its label, its runs (every status) and the
    measured steps of each ok run."""
    points_design = design(points)
    measured = measured_steps(points, steps)
    return [(row, points_design.label(row), group, _runs(group, measured))
            for row, group in _design_points(points, points_design)]


def runs_by_design_point(points: pd.DataFrame, steps: pd.DataFrame) -> list[tuple[dict, str, pd.DataFrame,
                                                                                    list[list[float]]]]:
    """`steps_by_design_point` with each ok run's measured step times, as measurement_table estimates from them."""
    return [(row, label, group, [_times(run) for run in runs])
            for row, label, group, runs in steps_by_design_point(points, steps)]


def _counts(runs: Sequence[Sequence[float]]) -> str:
    """`3×20` when every run measured as many steps, else each run's count."""
    counts = [len(run) for run in runs]
    if not counts:
        return NOT_APPLICABLE
    return f"{len(counts)}×{counts[0]}" if len(set(counts)) == 1 else ", ".join(map(str, counts))


def _check_names(cells: pd.Series) -> list[str]:
    """The check names (`trend`, `clock`, ...) of the JSON lists of reasons or flags in a column."""
    names = [text.partition(":")[0] for cell in cells if isinstance(cell, str) for text in json.loads(cell)]
    return list(dict.fromkeys(names))


def _flags(group: pd.DataFrame, runs: Sequence[Sequence[float]], spread: float | None) -> str:
    ok = group[group["status"] == OK]
    flags = []
    if runs and min(map(len, runs)) < MIN_MEASURED:
        flags.append(f"< {MIN_MEASURED} steps")
    if spread is not None and spread > REPEATS_AGREE:
        flags.append(f"repeats > {REPEATS_AGREE:.0%} apart")
    unsteady = ok[ok["steady"] == False]  # noqa: E712 (None: too few steps to judge, already flagged above)
    flags += [f"unsteady ({name})" for name in _check_names(unsteady.get("steady_reasons", pd.Series(dtype=str)))]
    flags += _check_names(ok.get("machine_flags", pd.Series(dtype=str)))
    graph_sets = ok.get("profiled_graphs", pd.Series(dtype=str)).dropna().nunique()
    if graph_sets > 1:  # each run profiled afresh and DeepCompile scheduled its graphs from what it measured
        flags.append(f"runs profiled {graph_sets} different graph sets")
    return ", ".join(flags) or NOT_APPLICABLE


def _point_head(row: Mapping[str, Any], label: str, group: pd.DataFrame,
                runs: Sequence[Sequence]) -> tuple[dict[str, Any], dict[tuple[str, str], str]]:
    """What every per-design-point table opens with: the values (the point, its runs, how many ok, the failed
    statuses, the measured steps) and the cells (arm, runs, measured)."""
    values = {**row, "n_runs": len(group), "n_ok": len(runs), "failed": failed_statuses(group["status"]),
              "measured": _counts(runs)}
    cells = {("", "arm"): label, ("", "runs"): f"{len(runs)}/{len(group)} ok", ("", "measured"): values["measured"]}
    return values, cells


def _step_time_cell(seconds: float | None, head: Mapping[str, Any]) -> str:
    """A point's step time, or, with no ok run, its failed statuses."""
    return format_number(seconds) if head["n_ok"] else head["failed"] or NOT_APPLICABLE


def measurement_table(points: pd.DataFrame, steps: pd.DataFrame) -> Table:
    """Per design point: runs, measured steps per run, the estimate (median over runs of each run's median) with its
    95% interval, the spread between repeats ((max - min) / estimate of the run medians), and flags."""
    rows, lines = [], []
    for row, label, group, runs in runs_by_design_point(points, steps):
        estimate = stats.median_of_runs(runs) if runs else None
        interval = stats.runs_interval(runs)
        medians = [float(pd.Series(run).median()) for run in runs]
        spread = (max(medians) - min(medians)) / estimate if len(runs) > 1 else None
        values, cells = _point_head(row, label, group, runs)
        rows.append({**values, "step_time_s": estimate, "ci95_low": interval and interval[0],
                     "ci95_high": interval and interval[1], "repeat_spread": spread})
        lines.append({**cells, ("", "s/step"): _step_time_cell(estimate, values),
                      ("", "95% interval"): step_interval_text(interval),
                      ("", "repeats apart"): NOT_APPLICABLE if spread is None else f"{spread:.1%}",
                      ("", "flags"): _flags(group, runs, spread)})
    return Table("measurement", pd.DataFrame(rows), display_frame(lines),
                 caption="Final-phase step time: the median over runs of each run's median over its measured steps, "
                         "with a 95% bootstrap interval (runs, then steps within each run).")


def step_interval_text(interval: tuple[float, float] | None) -> str:
    """`[0.07614, 0.0788]`: a step time's interval in seconds as the tables print it ('-' where there is none)."""
    return NOT_APPLICABLE if interval is None else f"[{format_number(interval[0])}, {format_number(interval[1])}]"


def context(row: Mapping[str, Any], columns: Sequence[str]) -> tuple:
    """A design point's values of `columns` as its labels write them: two points compare where these are equal."""
    return tuple(format_value(row.get(column)) for column in columns)


SEEDS = "seeds"  # the seeds a design point's runs used: like points ran the same ones


# On what footing our pass is set against DeepSpeed's: each given no budget, so each plans against the budget its own
# rule makes (ours the device rule, DeepSpeed's its margin: two rules as much as two passes), or both at one budget,
# given, or given to ours and made by DeepSpeed's rule for its pass. The table names the footing where it holds both.
EACH_DEFAULT, ONE_BUDGET = "(a) each pass at its own default", "(b) both passes at one budget"
GIVEN, PLANNED = "given_budget", "planned_budget"  # per design point: whether its runs were given one, and which


# Groups whose swept keys every arm runs with (DeepSpeed's sub-groups and reduce buckets, the optimizer, the
# allocator's settings): two points compared must share them, as they share the workload.
SHARED_SETTING_GROUPS = ("model", "train", "env")


def comparison_pairs(points: pd.DataFrame, design_keys: Sequence[str] = ()) -> list[tuple[str, tuple[str, ...]]]:
    """(the base's bench role, the columns two points must share to be compared): the workload (model, shape,
    accumulation, dtype, ranks, device) and the seeds of their runs, plus the limits and any swept setting of the
    groups every arm runs with (`train.sub_group_size`, among `design_keys`). Against DeepSpeed's pass, the budgets
    must also stand on one footing (peer_footing)."""
    present = [column for column in (*WORKLOAD_COLUMNS, *LIMIT_COLUMNS) if column in points]
    settings = [key for key in design_keys if key.split(".")[0] in SHARED_SETTING_GROUPS and key not in present]
    shared = (*present, *settings, SEEDS)
    return [(BenchRole.PEER, shared), (BenchRole.REFERENCE, shared)]


def _budget_facts(group: pd.DataFrame) -> dict[str, Any]:
    """GIVEN: whether every run of a design point was given a budget (None where only some were); PLANNED: the budget
    they planned against, the one given ('12.8 GB', '0.8 of the device') or else the one their rule made, to the MB,
    where every run has the same (None otherwise: the device rule's differs from run to run)."""
    runs = group.to_dict("records")
    given = {given_budget(run) for run in runs}
    if given == {True}:
        planned = {budget_name(run).removeprefix("@ ") for run in runs}
    else:
        planned = {None if is_missing(run.get("budget_resolved_gb")) else
                   f"{format_value(round(float(run['budget_resolved_gb']), 3))} GB" for run in runs}
    return {GIVEN: given.pop() if len(given) == 1 else None, PLANNED: planned.pop() if len(planned) == 1 else None}


def peer_footing(point: Mapping[str, Any], base: Mapping[str, Any]) -> str | None:
    """EACH_DEFAULT where neither design point was given a budget; ONE_BUDGET and the budget where both planned
    against the same one; None (not compared) otherwise."""
    if point[GIVEN] is False and base[GIVEN] is False:
        return EACH_DEFAULT
    if point[PLANNED] is not None and point[PLANNED] == base[PLANNED]:
        return f"{ONE_BUDGET} ({point[PLANNED]})"
    return None


def _seeds(group: pd.DataFrame) -> str:
    """The seeds of a design point's runs, as one value to compare (a point's repeats may vary the seed)."""
    return ",".join(sorted({format_value(seed) for seed in group["seed"]})) if "seed" in group else "null"


def _compared(design_points: list[tuple[dict, str, list]], points: pd.DataFrame, points_design: Design):
    """(ours, the point it is set against, the footing of their budgets or None), each point a (row, label, runs):
    each of our points against DeepSpeed's pass at the same workload and limits with budgets on one footing (neither
    over its budget: such a point is no point of it), those at their own defaults first; against DeepCompile without
    offload at the same workload and limits; then each of our points composed with DeepCompile's speed passes
    against ours alone (compose=none), everything else equal."""
    ours = arm_names(lambda arm: arm.bench_role == BenchRole.OURS)
    for role, shared in comparison_pairs(points, points_design.keys):
        bases = arm_names(lambda arm, role=role: arm.bench_role == role)
        pairs = [(point, base, peer_footing(point[0], base[0]) if role == BenchRole.PEER else None)
                 for point in design_points for base in design_points
                 if point[0]["arm"] in ours and base[0]["arm"] in bases
                 and context(point[0], shared) == context(base[0], shared)]
        if role == BenchRole.PEER:
            pairs = sorted((pair for pair in pairs if pair[2] is not None
                            and not (points_design.over_budget_note(pair[0][0])
                                     or points_design.over_budget_note(pair[1][0]))),
                           key=lambda pair: pair[2] != EACH_DEFAULT)
        yield from pairs
    others = [key for key in points_design.keys if key != COMPOSE] + [SEEDS]
    ours_by_compose = [(format_value(point[0].get(COMPOSE)), point) for point in design_points
                       if point[0]["arm"] in ours]
    composed = [point for compose, point in ours_by_compose if compose not in ("none", "null")]
    alone = [point for compose, point in ours_by_compose if compose == "none"]
    yield from ((point, base, None) for point in composed for base in alone
                if context(point[0], others) == context(base[0], others))


COMPARISON_COLUMNS = ["point", "against", "ratio", "ci95_low", "ci95_high", "runs", "reads", "retries_per_step",
                      "against_retries_per_step"]
FOOTING = "budgets"  # the comparison table's column naming the footing, where it holds both


def comparison_table(points: pd.DataFrame, steps: pd.DataFrame) -> Table:
    """Our pass over DeepSpeed's pass (same workload and limits, budgets on one footing) and over DeepCompile without
    offload (same workload and limits), and composed with DeepCompile's speed passes over alone: the ratio of their
    step-time estimates, its 95% two-level bootstrap interval, runs × the fewest measured steps of a run, and how it
    reads (faster, slower, no difference). Where it sets ours against DeepSpeed's pass on both footings, a column
    says which each line stands on."""
    design_points = [({**row, SEEDS: _seeds(group), **_budget_facts(group)}, label, runs)
                     for row, label, group, runs in steps_by_design_point(points, steps)]
    rows = []
    for (row, label, runs), (base, base_label, base_runs), footing in _compared(design_points, points,
                                                                                design(points)):
        ratio = stats.ratio_interval([_times(run) for run in runs], [_times(run) for run in base_runs])
        if ratio is not None:
            rows.append({"point": label, "against": base_label, FOOTING: footing, "ratio": ratio.ratio,
                         "ci95_low": ratio.low, "ci95_high": ratio.high, "runs": ratio.sizes, "reads": ratio.verdict,
                         "retries_per_step": retries_per_step(runs),
                         "against_retries_per_step": retries_per_step(base_runs)})
    footings = {row[FOOTING] for row in rows if row[FOOTING] is not None}
    both = any(footing == EACH_DEFAULT for footing in footings) and len(footings) > 1
    columns = ["point", "against", *([FOOTING] if both else []), *COMPARISON_COLUMNS[2:]]
    lines = [{("", "point"): row["point"], ("", "against"): row["against"],
              ("", FOOTING): row[FOOTING] or NOT_APPLICABLE,
              ("", "ratio"): f"{row['ratio']:.3f}×",
              ("", "95% interval"): stats.interval_text(row["ci95_low"], row["ci95_high"]),
              ("", "runs × steps"): row["runs"], ("", "reads"): row["reads"],
              ("", RETRIES_SHOWN): " / ".join(_per_step(row[key]) for key in ("retries_per_step",
                                                                             "against_retries_per_step"))}
             for row in rows]
    shown = [("", name) for name in ("point", "against", *([FOOTING] if both else []), "ratio", "95% interval",
                                     "runs × steps", "reads", RETRIES_SHOWN)]
    return Table("comparison", pd.DataFrame(rows, columns=[*COMPARISON_COLUMNS, FOOTING])[columns],
                 display_frame(lines, shown),
                 caption="Step time of the point over that of the point it is set against (< 1: faster), each the "
                         "median over runs of each run's median; a 95% bootstrap interval over runs, then steps. Only "
                         "like points are compared (same model, shape, accumulation, dtype and seeds, and any "
                         "model, train or env setting the sweep varies, such as train.sub_group_size), and at one "
                         "budget only points that kept it. retries/step: the allocator's retries per measured step of "
                         "each (the mean over its runs' steps; '-' where none were recorded), the noise a ratio "
                         "carries where they differ or vary." + (_FOOTING_CAPTION if both else ""))


RETRIES_SHOWN = "retries/step (point / against)"


def retries_per_step(runs: Sequence[pd.DataFrame]) -> float | None:
    """The mean allocator retries over a design point's measured steps, its runs pooled; None where no measured step
    recorded them."""
    recorded = [count for run in runs for count in _retries(run) if not math.isnan(count)]
    return sum(recorded) / len(recorded) if recorded else None


def _per_step(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


_FOOTING_CAPTION = (f" {FOOTING}: our pass against DeepSpeed's pass {EACH_DEFAULT} (neither given a budget: each "
                    f"plans against the one its own rule makes) or {ONE_BUDGET} (the same one given, or given to ours "
                    "and made by DeepSpeed's rule for its pass); a point over its budget stands on neither.")


RETRIES = "alloc_retries"


def _retries(run: pd.DataFrame) -> list[float]:
    """A run's retries per step, NaN where the step has none recorded (a CPU run, a run before the counter)."""
    return run[RETRIES].astype(float).tolist() if RETRIES in run else [math.nan] * len(run)
