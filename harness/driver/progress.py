"""Hangs by progress, not only by wall time: a point whose ranks write no new step for
launcher.stall_timeout_s ends as `timeout`, with a reason naming the last step written.

The clock starts at the first step written, so model build and the first compile are charged to
launcher.timeout_s alone, and it does not run while a phase's first step runs (DeepCompile compiles there).
Before the first step, launcher.startup_timeout_s bounds the start-up: a point that writes no step within it (a
rank waiting on a build lock that nobody will release, say) ends as `timeout`, its reason the worker log's last line.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional

from harness.contract import runfiles, safe_read


class StallWatch:
    """A poll for the launch loop: why the point stalled, or None while it makes progress."""

    def __init__(self, run_dir: Path, stall_timeout_s: float, steps_wanted: int,
                 clock: Callable[[], float] = time.monotonic):
        self._steps_path = Path(run_dir) / runfiles.STEPS
        self._facts_path = Path(run_dir) / runfiles.WORKER  # the ranks' facts, with the steps where a phase begins
        self._stall_timeout_s = stall_timeout_s
        self._steps_wanted = steps_wanted
        self._clock = clock
        self._size = 0
        self._steps_done = 0
        self._since = clock()
        self._phase_starts: set[int] | None = None

    def __call__(self) -> str | None:
        now = self._clock()
        size = self._steps_path.stat().st_size if self._steps_path.exists() else 0
        if size != self._size:  # a new step (rank 0 appends one line per step)
            self._size, self._since = size, now
            self._steps_done = self._steps_path.read_bytes().count(b"\n")
        if self._steps_done == 0 or self._steps_done in self._compiling_steps():
            return None
        waited = now - self._since
        if waited < self._stall_timeout_s:
            return None
        return (f"no new step for {waited:.0f} s after step {self._steps_done - 1}"
                f" ({self._steps_done} of {self._steps_wanted} steps)")

    def _compiling_steps(self) -> set[int]:
        """The steps where a phase begins, from worker.json (rank 0 writes it before the first step)."""
        if self._phase_starts is None:
            try:
                self._phase_starts = set(safe_read.read_json(self._facts_path)["phase_starts"])
            except (OSError, ValueError, KeyError, TypeError):  # safe_read.RefusedFile is a ValueError
                return set()
        return self._phase_starts


# How much of the worker log's end is read for its last line, and how much of that line a reason quotes.
_LOG_TAIL_BYTES = 8192
_LINE_CHARS = 300


class StartupWatch:
    """A poll for the launch loop: why the point wrote no step within `startup_timeout_s` of its launch (start-up,
    the model's build, DeepSpeed's op builds and the first step's compile all count), or None."""

    def __init__(self, run_dir: Path, startup_timeout_s: float, log_name: str = runfiles.LOG,
                 clock: Callable[[], float] = time.monotonic):
        self._steps_path = Path(run_dir) / runfiles.STEPS
        self._log_path = Path(run_dir) / log_name
        self._startup_timeout_s = startup_timeout_s
        self._clock = clock
        self._since = clock()
        self._stepped = False

    def __call__(self) -> str | None:
        if self._stepped or (self._steps_path.exists() and self._steps_path.stat().st_size > 0):
            self._stepped = True
            return None
        waited = self._clock() - self._since
        if waited < self._startup_timeout_s:
            return None
        return (f"no step within {waited:.0f} s of the launch (launcher.startup_timeout_s); the worker log's last "
                f"line: {last_line(self._log_path) or '(none)'}")


def last_line(log_path: Path) -> str | None:
    """The last non-empty line of a log, cut to _LINE_CHARS; None without one."""
    try:
        with open(log_path, "rb") as log:
            log.seek(max(0, log.seek(0, 2) - _LOG_TAIL_BYTES))
            tail = log.read().decode(errors="replace")
    except OSError:
        return None
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1][:_LINE_CHARS] if lines else None


def first_of(*watches: Optional[Callable[[], str | None]]) -> Callable[[], str | None] | None:
    """One poll of several (None ones left out): the first reason any of them gives."""
    present = [watch for watch in watches if watch is not None]
    if not present:
        return None
    return lambda: next((reason for watch in present if (reason := watch()) is not None), None)
