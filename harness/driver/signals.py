"""The driver's stop signals while no point's ranks run (launch.run_workers answers them while ranks run): Ctrl-C
(SIGINT) and a closed terminal (SIGHUP) end the sweep as `interrupted` (exit 130); outside SLURM, SIGTERM ends it as
`preempted` (exit 143; under SLURM it is a preemption the job's own handling answers).

A signal raises only where the driver's own code runs (`interruptible`): in the point's recording, before its
launch and after it (the W&B mirror). Between points Hydra's code runs, and an exception raised at any of its lines
can leave its state half-changed (an OmegaConf node mid-update), after which Hydra fails with an error of its own
(exit 1 and a traceback) instead of the stop. There a signal is only recorded, and the driver acts on it at the next
point's start (recording that point as stopped) or, after the last point, once Hydra returns.
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator, Mapping

from harness.cluster import stops

_received: list[int] = []  # the stop signals received, first first
_raising = [False]  # inside `interruptible`: the next signal raises


def stop_signals(environ: Mapping[str, str] = os.environ) -> tuple[signal.Signals, ...]:
    """SIGINT and SIGHUP everywhere; SIGTERM outside SLURM."""
    outside_slurm = "SLURM_JOB_ID" not in environ
    return (signal.SIGINT, signal.SIGHUP, *((signal.SIGTERM,) if outside_slurm else ()))


def install(environ: Mapping[str, str] = os.environ) -> None:
    """Handle the stop signals from here on (in the main thread only: Python delivers signals there)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in stop_signals(environ):
        signal.signal(signum, _on_signal)


def _on_signal(signum: int, frame) -> None:
    _received.append(signum)
    if _raising[0]:
        _raising[0] = False  # one raise: the handling that follows (recording the point) is not interrupted again
        raise stop_exception(signum)


def stop_exception(signum: int) -> BaseException:
    """What a stop signal raises: stops.Terminated for SIGTERM, KeyboardInterrupt (naming the signal) else."""
    name = signal.Signals(signum).name
    return stops.Terminated(name) if signum == signal.SIGTERM else KeyboardInterrupt(name)


def status_of(signum: int) -> str:
    return "preempted" if signum == signal.SIGTERM else "interrupted"


def received() -> int | None:
    """The first stop signal received, or None."""
    return _received[0] if _received else None


def forget() -> None:
    """Forget the signals received (for tests that send them to their own process)."""
    _received.clear()
    _raising[0] = False


@contextmanager
def interruptible() -> Iterator[None]:
    """The driver's own code: a stop signal raises at once, and one received before raises on entry."""
    if _received:
        raise stop_exception(_received[0])
    _raising[0] = True
    try:
        yield
    finally:
        _raising[0] = False
