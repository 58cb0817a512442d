"""Hangs by progress, not only by wall time: a point whose ranks write no new step for
launcher.stall_timeout_s ends as `timeout`, with a reason naming the last step written.

The clock starts at the first step written, so model build and the first compile are charged to
launcher.timeout_s alone, and it does not run while a phase's first step runs (DeepCompile compiles there).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from harness.contract import runfiles


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
                self._phase_starts = set(json.loads(self._facts_path.read_text())["phase_starts"])
            except (OSError, ValueError, KeyError):
                return set()
        return self._phase_starts
