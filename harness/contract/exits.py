"""What the driver's exit code says, so a script can tell a point that ran every step from one that did not, and a
sweep that recorded every point from one that lost some (README, "Exit codes").

One point (no `-m`): 0 `ok`; 2 refused before launch (`config_error`, or a config error on the command line); 130
stopped by Ctrl-C or SIGHUP (`interrupted`); 143 stopped by SIGTERM outside SLURM (`preempted`); 75 requeued by
SLURM; 1 any other status (`oom`, `died`, `timeout`, `skipped`, `error`, `preempted` under SLURM).
A sweep (`-m`): 0 when every point was recorded with its summary, whatever its status; 1 when a point left no
summary or the sweep itself failed (with `sweep.strict=true` also when a point is not `ok`); 2, 130 and 143 as for
one point (a refused command line runs no point; a signal ends the sweep after writing its index).
"""
from __future__ import annotations

import os
from typing import Iterable

OK = 0
FAILED = 1
CONFIG_ERROR = 2
REQUEUED = os.EX_TEMPFAIL  # submitit waits for SLURM to run the job again instead of taking a result
_STOPPED = {"interrupted": 130, "preempted": 143}  # 128 + SIGINT, 128 + SIGTERM: the shell's codes for them


def point_exit_code(status: str) -> int:
    """A single point's code, unless a signal ended it (stopped_exit_code): 0 only when it ran every step."""
    return {"ok": OK, "config_error": CONFIG_ERROR}.get(status, FAILED)


def stopped_exit_code(status: str) -> int:
    """The code of a point, and its sweep, that a signal ended (`interrupted` or `preempted`)."""
    return _STOPPED[status]


def sweep_exit_code(statuses: Iterable[str], unrecorded: int, strict: bool) -> int:
    """A finished sweep's code: 0 when every point was recorded (and, if strict, every point is ok)."""
    if unrecorded or (strict and any(status != "ok" for status in statuses)):
        return FAILED
    return OK
