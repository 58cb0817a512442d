"""`sweep.stop_at` (seconds since the epoch): a sweep given a fixed stretch of machine time starts no point it
cannot finish by then. Such a point is recorded `skipped`, naming the time left against what a point of this
sweep has taken, and, with `sweep.resume=true`, the next call of the same command runs it. A point killed by the
end of its machine's time costs its minutes and keeps nothing; a skipped one costs nothing.

What a point takes is read from this sweep's own earlier points: the longest wall time (launch to the ranks' exit)
recorded by a sibling's summary.json in the sweep folder, an earlier call's included. Before any point has finished
there is nothing to go by, so the sweep's first point always starts: set stop_at with that much to spare. A single
run (no multirun) always starts too: its folder lies among unrelated runs.
"""
from __future__ import annotations

import time
from pathlib import Path

from harness.contract import runfiles, safe_read
from harness.contract.checks import is_usable_number
from harness.contract.statuses import STOP_AT_REASON
from harness.driver.resume import recorded


def longest_point_s(sweep_dir: Path, this_point: Path) -> float | None:
    """The longest wall time a finished point of this sweep recorded (None where none did; a summary that cannot be
    read tells nothing)."""
    walls = [recorded(summary_path.parent, runfiles.SUMMARY, safe_read.read_json, "wall_time_s")
             for summary_path in sorted(sweep_dir.glob(f"*/{runfiles.SUMMARY}")) if summary_path.parent != this_point]
    return max((float(wall) for wall in walls if is_usable_number(wall) and wall > 0), default=None)


def reason_to_skip(stop_at: float | None, run_dir: Path, sweep_dir: Path | None,
                   now: float | None = None) -> str | None:
    """Why this point must not start before `stop_at` (sweep.stop_at), or None where it may: no stop_at, no sweep
    (a single run's folder lies among unrelated runs), nothing recorded to go by, or time for a point as long as the
    sweep's longest."""
    if stop_at is None or sweep_dir is None:
        return None
    left = stop_at - (time.time() if now is None else now)
    needed = longest_point_s(sweep_dir, run_dir)
    if needed is None or left >= needed:
        return None
    return (f"{STOP_AT_REASON} {max(left, 0):.0f} s left, and a point of this sweep has taken {needed:.0f} s "
            f"(run it again with sweep.resume=true)")
