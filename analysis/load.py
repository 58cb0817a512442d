"""Load sweep dirs (index + run dirs) into tidy DataFrames: one row per point, one per step (the row's
columns: `analysis.columns`; the same rows from W&B: `analysis.wandb_export`).

The run files come through harness.contract.reader, the one reader of run dirs (never importing what a file names, never
leaving the sweep dir): a point whose config.yaml or summary.json is missing or malformed is left out; a missing
env.json or bad steps.jsonl lines only cost those columns or rows. Each problem becomes one `Problem` naming the
file, so callers can print one warning line per file and list the points left out.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.columns import OVER_BUDGET, cell_value, config_row, profiled_step_row, recorded_auto_rule, \
    retry_trace_row, summary_row
from analysis.wall_split import compile_columns
from harness.arms import known_class
from harness.contract.budget import recorded_over_budget_bytes
from harness.contract.reader import Problem, RunFiles, SweepFiles, read_sweep
from harness.contract.runfiles import job_order
from harness.contract.statuses import OK
from harness.contract.units import GB

__all__ = ["GB", "OK", "Problem", "Sweep", "load_sweep", "load_sweeps", "resolved_budget_gb"]


@dataclass
class Sweep:
    points: pd.DataFrame  # one row per point
    steps: pd.DataFrame  # one row per step of every point, keyed by (sweep, run_dir)
    problems: list[Problem]

    @property
    def left_out(self) -> list[str]:
        return [problem.point for problem in self.problems if problem.point is not None]

    def problem_report(self) -> str:
        """One warning line per unreadable file, then the points left out (empty when all files read)."""
        lines = [problem.line() for problem in self.problems]
        if self.left_out:
            lines.append(f"left out {len(self.left_out)} point(s): {', '.join(self.left_out)}")
        return "\n".join(lines)


def load_sweeps(sweep_dirs: Iterable[str | Path]) -> Sweep:
    """Several sweeps as one: rows keep their `sweep` column."""
    return combined([load_sweep(sweep_dir) for sweep_dir in sweep_dirs])


def combined(sweeps: list[Sweep]) -> Sweep:
    return Sweep(
        points=_concat([sweep.points for sweep in sweeps]),
        steps=_concat([sweep.steps for sweep in sweeps]),
        problems=[problem for sweep in sweeps for problem in sweep.problems],
    )


def load_sweep(sweep_dir: str | Path) -> Sweep:
    """All points of one Hydra multirun dir (or of a single run dir)."""
    return sweep_of(Path(sweep_dir), read_sweep(sweep_dir, known_class))


def sweep_of(sweep_dir: Path, files: SweepFiles) -> Sweep:
    """The rows of a sweep's run files as the reader read them."""
    # Every point gets a column for any key overridden anywhere in the sweep, so the column can vary.
    override_keys = list(dict.fromkeys(key for point in files.overrides.values() for key in _override_values(point)))
    rows, step_frames = [], []
    for point in files.points:
        row = _point_row(sweep_dir, point, override_keys)
        rows.append(row)
        step_frames.append(_steps_frame(point.steps, row))
    points = pd.DataFrame(rows)
    if not points.empty:
        points = points.sort_values("run_dir", key=lambda dirs: dirs.map(job_order), kind="stable")
    return Sweep(points=points.reset_index(drop=True), steps=_concat(step_frames), problems=files.problems)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [frame for frame in frames if not frame.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _point_row(sweep_dir: Path, point: RunFiles, override_keys: list[str]) -> dict[str, Any]:
    row = {"sweep": str(sweep_dir), "run_dir": point.run_dir, "overrides": " ".join(point.overrides)}
    config = recorded_auto_rule(point.config, point.plan and point.plan.rule, planned=point.plan is not None)
    row.update(config_row(config, override_keys, _override_values(point.overrides)))
    row.update(summary_row(point.summary))
    row["plan_rule"] = point.plan and point.plan.rule
    row["plan_budget_bytes"] = point.plan and point.plan.budget_bytes
    row.update({f"env_{key}": cell_value(value) for key, value in (point.env or {}).items()})
    row["budget_resolved_gb"] = resolved_budget_gb(row)
    row[OVER_BUDGET] = recorded_over_budget_bytes(point.summary, point.steps)
    if point.retry_trace is not None:  # only traced points get these columns: other sweeps' frames stay as they were
        row.update(retry_trace_row(point.retry_trace))
    if point.profiled_step is not None:  # the same for a profiled step, and for compile counters (compile_columns)
        row.update(profiled_step_row(point.profiled_step))
    row.update(compile_columns(point.summary))
    return row


def _override_values(overrides: Iterable[str]) -> dict[str, str]:
    """key -> value as written ('+experiments/rows=zero3' -> {'experiments/rows': 'zero3'})."""
    pairs = (override.lstrip("+~").split("=", 1) for override in overrides if "=" in override)
    return {key: value for key, value in pairs if not key.startswith("hydra.")}


def resolved_budget_gb(row: Mapping[str, Any]) -> float | None:
    """The budget the point planned against: its plan's (our pass's device rule plans against the device less the
    overhead it measured, not the budget the driver resolved), else the driver's resolved bytes, else the configured
    GB."""
    for column in ("plan_budget_bytes", "budget_bytes"):
        budget_bytes = row.get(column)
        if budget_bytes is not None and not pd.isna(budget_bytes):
            return budget_bytes / GB
    return row.get("budget_gb")


def _steps_frame(records: list[dict], row: Mapping[str, Any]) -> pd.DataFrame:
    steps = pd.DataFrame(records)
    if not steps.empty:
        steps.insert(0, "run_dir", row["run_dir"])
        steps.insert(0, "sweep", row["sweep"])
    return steps
