"""Where a point's results go beyond its run dir: the W&B mirror and the sweep's index."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from harness.contract import exits, reader, runfiles, schema
from harness.contract.sweep_index import index_line
from harness.contract.runfiles import UNNUMBERED, job_order

logger = logging.getLogger(__name__)


def flat_summary(summary: dict) -> dict[str, Any]:
    """summary.json as flat W&B summary keys: `final/step_time_s/median`, `phase1/...`, `status`, `steady` and why
    not, the machine's flags."""
    flat: dict[str, Any] = {"status": summary["status"], "reason": summary["reason"],
                            "steps_completed": summary["steps_completed"], "steady": summary.get("steady"),
                            "steady_reasons": summary.get("steady_reasons") or [],
                            "machine_flags": (summary.get("machine") or {}).get("flags") or []}
    blocks = [(f"phase{p['phase']}", p) for p in summary["phases"]]
    if summary.get("final"):
        blocks.append(("final", summary["final"]))
    for prefix, block in blocks:
        for key, value in block.items():
            if isinstance(value, dict):
                for stat, number in value.items():
                    flat[f"{prefix}/{key}/{stat}"] = number
            elif key not in ("phase",):
                flat[f"{prefix}/{key}"] = value
    return flat


def mirror_to_wandb(run_dir: Path, config: schema.Config, rows: list[dict], summary: dict, env: dict) -> dict[str, Any]:
    """One W&B run per point, from the driver: config (as config.yaml holds it), step history, summary, env; the
    run's group is the sweep's name.

    Returns the summary W&B holds for the run, read back from the run object, so callers can check it.
    """
    import wandb

    logger = config.logger
    run = wandb.init(mode=logger.mode or "offline", project=logger.project, entity=logger.entity, dir=str(run_dir),
                     group=config.sweep.name, job_type=config.arm.name, name=Path(run_dir).name,
                     config=dict(config.written), reinit="finish_previous")
    try:
        for row in rows:
            run.log({k: v for k, v in row.items() if k != "step" and v is not None}, step=row["step"])
        run.summary.update(flat_summary(summary))
        run.summary.update({f"env/{k}": v for k, v in env.items() if not isinstance(v, (list, dict))})
        return {k: run.summary[k] for k in run.summary.keys()}
    finally:
        run.finish()


def index_lines(sweep_dir: Path) -> list[dict[str, Any]]:
    """One index entry per run dir with a readable summary, in job order; one warning line for each other."""
    lines = []
    for run_dir in iter_run_dirs(sweep_dir):
        try:
            line = index_line(sweep_dir, run_dir)
        except (OSError, reader.MalformedFile) as error:
            logger.warning(f"warning: {run_dir}: left out of the index: {error}")
            continue
        if line is not None:
            lines.append(line)
    return lines


def write_sweep_index(sweep_dir: Path) -> Path:
    """(Re)build index.jsonl from every run dir under a sweep dir: one line per point, in job order."""
    return _write_index(Path(sweep_dir), index_lines(Path(sweep_dir)))


def _write_index(sweep_dir: Path, lines: list[dict[str, Any]]) -> Path:
    path = sweep_dir / runfiles.INDEX
    runfiles.write_atomic(path, "".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))
    return path


def iter_run_dirs(sweep_dir: Path) -> list[Path]:
    """Run dirs of a sweep (those with a summary), in Hydra job order."""
    return sorted((p.parent for p in Path(sweep_dir).glob(f"*/{runfiles.SUMMARY}")), key=job_order)


def point_dirs(sweep_dir: Path) -> list[Path]:
    """Every point folder Hydra made in a sweep dir ('<job num>_...'), recorded or not."""
    return sorted((p for p in Path(sweep_dir).iterdir() if p.is_dir() and job_order(p)[0] != UNNUMBERED),
                  key=job_order)


@dataclass(frozen=True)
class SweepOutcome:
    """What the index of a finished (or stopped) sweep says: each recorded point's status, and the point folders
    that hold no readable summary (a driver killed outright, a folder it could not write)."""
    statuses: tuple[str, ...]
    unrecorded: tuple[str, ...]


class SweepIndexCallback(Callback):
    """Writes the sweep dir's index.jsonl when a multirun ends (also after failed points), or through
    write_running_index when a signal or a failure ends it early (Hydra calls no callback then). Never raises:
    a sweep's index is written whatever happens to it."""

    running_sweep_dir: Path | None = None  # the sweep dir of the multirun in this process
    strict: bool = False                   # sweep.strict: a point that is not ok fails the sweep
    outcome: SweepOutcome | None = None    # set once the index is written

    def on_multirun_start(self, config, **kwargs) -> None:
        SweepIndexCallback.running_sweep_dir = Path(config.hydra.sweep.dir)
        SweepIndexCallback.strict = OmegaConf.select(config, "sweep.strict", default=False,
                                                     throw_on_resolution_failure=False) is True
        SweepIndexCallback.outcome = None

    def on_multirun_end(self, config, **kwargs) -> None:
        SweepIndexCallback.write_running_index()

    @staticmethod
    def write_running_index() -> None:
        sweep_dir = SweepIndexCallback.running_sweep_dir
        if sweep_dir is None or not sweep_dir.exists():
            return
        try:
            lines = index_lines(sweep_dir)
            path = _write_index(sweep_dir, lines)
            listed = {line["run_dir"] for line in lines}
            unrecorded = tuple(p.name for p in point_dirs(sweep_dir) if p.name not in listed)
        except Exception as error:  # the sweep's points are recorded in their run dirs; say why the index is not
            logger.warning(f"warning: sweep index of {sweep_dir} not written: {error}")
            SweepIndexCallback.outcome = SweepOutcome((), (runfiles.INDEX,))
            return
        SweepIndexCallback.outcome = SweepOutcome(tuple(line["status"] for line in lines), unrecorded)
        logger.info(f"sweep index: {path} ({len(lines)} points)")
        if unrecorded:
            logger.warning(f"warning: {len(unrecorded)} point(s) left no summary: {', '.join(unrecorded)}")

    @staticmethod
    def exit_code() -> int | None:
        """The finished multirun's exit code (harness.contract.exits), or None where no multirun ran in this process."""
        if SweepIndexCallback.running_sweep_dir is None:
            return None
        if SweepIndexCallback.outcome is None:
            SweepIndexCallback.write_running_index()
        outcome = SweepIndexCallback.outcome or SweepOutcome((), (runfiles.INDEX,))
        return exits.sweep_exit_code(outcome.statuses, len(outcome.unrecorded), SweepIndexCallback.strict)
