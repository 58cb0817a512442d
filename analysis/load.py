"""Load sweep dirs (index + run dirs) into tidy DataFrames: one row per point, one per step (the row's
columns: `analysis.columns`; the same rows from W&B: `analysis.wandb_export`).

A point whose config.yaml or summary.json is missing or malformed is left out; a missing env.json or bad
steps.jsonl lines only cost those columns or rows. Each problem becomes one `Problem` naming the file, so
callers can print one warning line per file and list the points left out.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from analysis.columns import cell_value, config_row, summary_row
from harness import runfiles
from harness.checks import lookup
from harness.launch import STATUSES
from harness.sinks import job_order
from harness.units import GB

OK = "ok"
STEP_FIELDS = ("step", "phase", "phase_step", "step_time_s")  # a steps.jsonl line without these is unreadable


@dataclass(frozen=True)
class Problem:
    """One unreadable run file; `point` is the run dir left out of the tables, or None if the point stays."""

    file: str
    message: str
    point: str | None = None

    def line(self) -> str:
        left_out = "; point left out" if self.point is not None else ""
        return f"warning: {self.file}: {self.message}{left_out}"


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


class MalformedFile(ValueError):
    """A run file that exists but does not follow the run-file contract."""


def load_sweeps(sweep_dirs: Iterable[str | Path]) -> Sweep:
    """Several sweeps as one: rows keep their `sweep` column."""
    sweeps = [load_sweep(sweep_dir) for sweep_dir in sweep_dirs]
    return Sweep(
        points=_concat([sweep.points for sweep in sweeps]),
        steps=_concat([sweep.steps for sweep in sweeps]),
        problems=[problem for sweep in sweeps for problem in sweep.problems],
    )


def load_sweep(sweep_dir: str | Path) -> Sweep:
    """All points of one Hydra multirun dir (or of a single run dir)."""
    sweep_dir = Path(sweep_dir)
    problems: list[Problem] = []
    listed = _read_index(sweep_dir, problems)
    overrides = {run_dir: listed[run_dir] if run_dir in listed else _hydra_overrides(sweep_dir / run_dir)
                 for run_dir in _run_dirs(sweep_dir, listed)}
    # Every point gets a column for any key overridden anywhere in the sweep, so the column can vary.
    override_keys = list(dict.fromkeys(key for point in overrides.values() for key in _override_values(point)))
    rows, step_frames = [], []
    for run_dir, point_overrides in overrides.items():
        point = _load_point(sweep_dir, run_dir, point_overrides, override_keys, problems)
        if point is None:
            continue
        row, steps = point
        rows.append(row)
        step_frames.append(steps)
    points = pd.DataFrame(rows)
    if not points.empty:
        points = points.sort_values("run_dir", key=lambda dirs: dirs.map(job_order), kind="stable")
    return Sweep(points=points.reset_index(drop=True), steps=_concat(step_frames), problems=problems)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [frame for frame in frames if not frame.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _read_index(sweep_dir: Path, problems: list[Problem]) -> dict[str, list[str]]:
    """run_dir -> overrides; the index may repeat a point (driver append + end-of-sweep callback)."""
    index_file = sweep_dir / runfiles.INDEX
    if not index_file.is_file():
        return {}
    listed: dict[str, list[str]] = {}
    bad_lines = []
    for number, line in enumerate(index_file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            run_dir = entry["run_dir"]
            overrides = list(entry.get("overrides") or [])
        except (ValueError, KeyError, TypeError):
            bad_lines.append(number)
            continue
        listed[str(run_dir)] = overrides
    if bad_lines:
        problems.append(Problem(str(index_file), f"unreadable line(s) {_numbers(bad_lines)}"))
    return listed


def _numbers(numbers: list[int]) -> str:
    return ", ".join(str(number) for number in numbers)


def _run_dirs(sweep_dir: Path, listed: Mapping[str, list[str]]) -> list[str]:
    """Run dirs named in the index plus those on disk (a point whose driver died never reached the index)."""
    if (sweep_dir / runfiles.CONFIG).is_file() or (sweep_dir / runfiles.SUMMARY).is_file():
        return ["."]
    on_disk = [
        child.name for child in sorted(sweep_dir.iterdir())
        if child.is_dir() and ((child / runfiles.CONFIG).exists() or (child / runfiles.SUMMARY).exists())
    ] if sweep_dir.is_dir() else []
    return list(dict.fromkeys([*listed, *on_disk]))


def _load_point(sweep_dir: Path, run_dir: str, overrides: list[str], override_keys: list[str],
                problems: list[Problem]) -> tuple[dict[str, Any], pd.DataFrame] | None:
    path = sweep_dir / run_dir
    try:
        config = _read_config(path / runfiles.CONFIG)
        summary = _read_summary(path / runfiles.SUMMARY)
    except (OSError, MalformedFile) as error:
        problems.append(Problem(_problem_file(error), _describe(error), point=str(path)))
        return None
    row = {"sweep": str(sweep_dir), "run_dir": run_dir, "overrides": " ".join(overrides)}
    row.update(config_row(config, override_keys, _override_values(overrides)))
    row.update(summary_row(summary))
    row.update(_env_row(path / runfiles.ENV, problems))
    row["budget_resolved_gb"] = resolved_budget_gb(row)
    steps = _read_steps(path / runfiles.STEPS, row, problems)
    return row, steps


def _problem_file(error: Exception) -> str:
    return str(error.filename) if isinstance(error, OSError) else str(error.args[0])


def _describe(error: Exception) -> str:
    if isinstance(error, FileNotFoundError):
        return "missing"
    if isinstance(error, OSError):
        return f"unreadable ({error.strerror})"
    return str(error.args[1])


def _read_config(config_file: Path) -> Mapping[str, Any]:
    try:
        config = yaml.safe_load(config_file.read_text())
    except yaml.YAMLError as error:
        raise MalformedFile(str(config_file), f"not valid YAML ({type(error).__name__})") from error
    if not isinstance(config, Mapping) or not lookup(config, "arm.name", None) or not lookup(config, "model.name", None):
        raise MalformedFile(str(config_file), "not a resolved config (needs arm.name and model.name)")
    return config


def _read_summary(summary_file: Path) -> Mapping[str, Any]:
    try:
        summary = json.loads(summary_file.read_text())
    except ValueError as error:
        raise MalformedFile(str(summary_file), "not valid JSON") from error
    if not isinstance(summary, Mapping) or summary.get("status") not in STATUSES:
        raise MalformedFile(str(summary_file), f"needs a status, one of {', '.join(STATUSES)}")
    phases = summary.get("phases") or []
    final = summary.get("final")
    if not isinstance(phases, list) or not all(isinstance(phase, Mapping) for phase in phases) \
            or not (final is None or isinstance(final, Mapping)):
        raise MalformedFile(str(summary_file), "phases must be a list of objects and final an object or null")
    return summary


def _hydra_overrides(path: Path) -> list[str]:
    """Overrides of a point missing from the index, from Hydra's own record when it is there."""
    try:
        overrides = yaml.safe_load((path / runfiles.OVERRIDES).read_text())
    except (OSError, yaml.YAMLError):
        return []
    return [str(override) for override in overrides] if isinstance(overrides, list) else []


def _override_values(overrides: Iterable[str]) -> dict[str, str]:
    """key -> value as written ('+experiments/rows=zero3' -> {'experiments/rows': 'zero3'})."""
    pairs = (override.lstrip("+~").split("=", 1) for override in overrides if "=" in override)
    return {key: value for key, value in pairs if not key.startswith("hydra.")}


def resolved_budget_gb(row: Mapping[str, Any]) -> float | None:
    """The budget the point planned against: the driver's resolved bytes, else the configured GB."""
    budget_bytes = row.get("budget_bytes")
    if budget_bytes is not None and not pd.isna(budget_bytes):
        return budget_bytes / GB
    return row.get("budget_gb")


def _env_row(env_file: Path, problems: list[Problem]) -> dict[str, Any]:
    try:
        env = json.loads(env_file.read_text())
        if not isinstance(env, Mapping):
            raise ValueError
    except FileNotFoundError:
        problems.append(Problem(str(env_file), "missing; env columns left empty"))
        return {}
    except (OSError, ValueError):
        problems.append(Problem(str(env_file), "not a JSON object; env columns left empty"))
        return {}
    return {f"env_{key}": cell_value(value) for key, value in env.items()}


def _read_steps(steps_file: Path, row: Mapping[str, Any], problems: list[Problem]) -> pd.DataFrame:
    try:
        lines = steps_file.read_text().splitlines()
    except FileNotFoundError:
        if row.get("steps_completed"):
            problems.append(Problem(str(steps_file), "missing; no per-step series for this point"))
        return pd.DataFrame()
    records, bad_lines = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or any(field not in record for field in STEP_FIELDS):
                raise ValueError
        except ValueError:
            bad_lines.append(number)
            continue
        records.append(record)
    if bad_lines:
        problems.append(Problem(str(steps_file), f"unreadable line(s) {_numbers(bad_lines)} skipped"))
    steps = pd.DataFrame(records)
    if not steps.empty:
        steps.insert(0, "run_dir", row["run_dir"])
        steps.insert(0, "sweep", row["sweep"])
    return steps
