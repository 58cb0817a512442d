"""`sweep.stop_at` (seconds since the epoch): a sweep given a fixed stretch of machine time starts no point it
cannot finish by then. Such a point is recorded `skipped`, naming the time left against what a point of this
sweep takes, and, with `sweep.resume=true`, the next call of the same command runs it. A point killed by the
end of its machine's time costs its minutes and keeps nothing; a skipped one costs nothing.

What a point takes is read from this sweep's own earlier points (their summary.json in the sweep folder, an earlier
call's included), in two parts, so that one machine's one-time builds do not count against every later point:
- the work: the longest wall time (launch to the ranks' exit) less its start-up (summary.json's startup_s:
  imports, the model, the engine) over every finished point, so a long point of another shape still counts;
- the start-up on this machine (the boot env.json names): the longest of this boot's points, each less the op
  builds it made (summary.json's op_build_s, harness/driver/op_builds.py: DeepSpeed's JIT ops, ~95 s on a fresh
  machine), which the later points reuse. Where one of this boot's points recorded no op_build_s (a point recorded
  before it was), the longest start-up of this boot's points but the very longest, its first's; where this boot
  has run none, the longest start-up of any: a fresh machine builds again.
Before any point of the sweep has finished, its first point goes by the sweeps beside it (the Hydra multiruns in the
same parent folder: under the default `multirun/NAME/STAMP` the same experiment's earlier calls; under a parent a
queue of campaigns shares, the campaigns before it): the median of their points' wall times, each less the op
builds it made where this machine has run one of them (its ops are built). A neighbour's point is only a guide to
this sweep's, so it takes the typical one, not the longest: a call as long as a typical point still starts the
sweep, and one too short for it does not start a point its end would kill. With none beside it the first point
always starts: set stop_at with that much to spare. A single run (no multirun) always starts too: its folder lies
among unrelated runs.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from harness.contract import runfiles, safe_read
from harness.contract.checks import is_usable_number
from harness.contract.envinfo import boot_id
from harness.contract.statuses import STOP_AT_REASON
from harness.driver.resume import recorded


@dataclass(frozen=True)
class FinishedPoint:
    """What an earlier point of the sweep took: its wall time, the start-up inside it (0 where not recorded), the
    boot of the machine that ran it and the op builds it made (each None where not recorded)."""
    wall_s: float
    startup_s: float
    boot: str | None
    op_build_s: float | None = None


def finished_points(sweep_dir: Path, this_point: Path | None = None) -> list[FinishedPoint]:
    """The sweep's other points that recorded a wall time (a summary that cannot be read tells nothing)."""
    found = []
    for summary_path in sorted(sweep_dir.glob(f"*/{runfiles.SUMMARY}")):
        run_dir = summary_path.parent
        if run_dir == this_point:
            continue
        summary = recorded(run_dir, runfiles.SUMMARY, safe_read.read_json)
        wall = summary.get("wall_time_s") if isinstance(summary, dict) else None
        if not (is_usable_number(wall) and wall > 0):
            continue
        startup = summary.get("startup_s")
        startup = min(float(startup), float(wall)) if is_usable_number(startup) and startup > 0 else 0.0
        builds = summary.get("op_build_s")
        builds = float(builds) if is_usable_number(builds) and builds >= 0 else None
        boot = recorded(run_dir, runfiles.ENV, safe_read.read_json, "boot_id")
        found.append(FinishedPoint(float(wall), startup, boot if isinstance(boot, str) else None, builds))
    return found


def neighbour_points(sweep_dir: Path) -> list[FinishedPoint]:
    """The finished points of the multiruns beside this one (none unless this sweep dir is a multirun's)."""
    if not (sweep_dir / runfiles.MULTIRUN).is_file():
        return []
    neighbours = sorted(path.parent for path in sweep_dir.parent.glob(f"*/{runfiles.MULTIRUN}"))
    return [point for neighbour in neighbours if neighbour != sweep_dir for point in finished_points(neighbour)]


def point_s_needed(finished: list[FinishedPoint], boot: str | None) -> float | None:
    """Seconds the next point will take on the machine of `boot` (module docstring), None with nothing to go by."""
    if not finished:
        return None
    work = max(point.wall_s - point.startup_s for point in finished)
    here = [point for point in finished if boot is not None and point.boot == boot]
    if here and all(point.op_build_s is not None for point in here):
        startup = max(max(point.startup_s - point.op_build_s, 0.0) for point in here)
    elif len(here) > 1:
        startup = sorted((point.startup_s for point in here), reverse=True)[1]
    else:
        startup = max(point.startup_s for point in finished)
    return work + startup


def typical_neighbour_s(neighbours: list[FinishedPoint], boot: str | None) -> float | None:
    """Seconds a point of the sweeps beside this one typically took (module docstring), None with none."""
    if not neighbours:
        return None
    built_here = boot is not None and any(point.boot == boot for point in neighbours)
    return statistics.median(point.wall_s - (point.op_build_s or 0.0) if built_here else point.wall_s
                             for point in neighbours)


def reason_to_skip(stop_at: float | None, run_dir: Path, sweep_dir: Path | None,
                   now: float | None = None, boot: str | None = None) -> str | None:
    """Why this point must not start before `stop_at` (sweep.stop_at), or None where it may: no stop_at, no sweep
    (a single run's folder lies among unrelated runs), nothing recorded to go by, or time for what a point takes on
    this machine (`boot`: this machine's boot id where not given)."""
    if stop_at is None or sweep_dir is None:
        return None
    left = stop_at - (time.time() if now is None else now)
    own, boot = finished_points(sweep_dir, run_dir), boot_id() if boot is None else boot
    needed = point_s_needed(own, boot) if own else typical_neighbour_s(neighbour_points(sweep_dir), boot)
    if needed is None or left >= needed:
        return None
    whose = "a point of this sweep" if own else "a point of the sweeps beside this one typically"
    return (f"{STOP_AT_REASON} {max(left, 0):.0f} s left, and {whose} takes {needed:.0f} s here "
            f"(run it again with sweep.resume=true)")
