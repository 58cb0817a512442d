"""How long compute waits for our copies, and how long the copy streams are busy, in device time per step.

A wait of the compute stream on a copy's event is a stream wait: the host does not block, so host clocks cannot
see it. Two timing events recorded on the compute stream, one before the wait and one after, complete when the
stream reaches them: the second cannot complete before the copy has, so their distance is the time compute stood
still for that copy (0 when the copy was already done). A copy stream's busy time is the distance between events
recorded right before and right after each copy (after the stream's own waits). Blocking mode waits on the host:
that wall time is the stall there. Reclaimed release's waits at its sites are host waits with the device still busy
on the queued forward, so they are kept apart (`reclaim_wait_s`): not a stall unless the device runs dry.

Pairs are kept until `collect()`, which the worker calls after its end-of-step synchronize. A pair whose end the
device has not reached yet (a copy that runs on past a step synchronized on its compute stream alone,
`train.step_sync=compute`) stays for a later collect, so reading the events never waits for the device and a copy
counts in the step where it is seen done.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

STALL = "offload_stall_s"
D2H_BUSY = "copy_d2h_busy_s"
H2D_BUSY = "copy_h2d_busy_s"
RECLAIM_WAIT = "reclaim_wait_s"
TIMES = (STALL, D2H_BUSY, H2D_BUSY, RECLAIM_WAIT)


class StallRecorder:
    """Event pairs on the device; `collect` turns them into cumulative seconds per kind."""

    def __init__(self, device):
        self.device = device
        self._pairs: list[tuple[str, Any, Any]] = []
        self.totals = {kind: 0.0 for kind in TIMES}

    def compute_waits(self, event: Any) -> None:
        """Make the compute stream wait for `event`, timing how long it stands still there."""
        compute = self.device.current_stream()
        before = self.device.new_event(timing=True)
        before.record(compute)
        compute.wait_event(event)
        after = self.device.new_event(timing=True)
        after.record(compute)
        self._pairs.append((STALL, before, after))

    @contextlib.contextmanager
    def copy_on(self, stream: Any, kind: str) -> Iterator[None]:
        """Time the work queued inside the block on a copy stream (which must be the current stream there)."""
        start = self.device.new_event(timing=True)
        start.record(stream)
        yield
        end = self.device.new_event(timing=True)
        end.record(stream)
        self._pairs.append((kind, start, end))

    @contextlib.contextmanager
    def host_wait(self, kind: str = STALL) -> Iterator[None]:
        """A host wait for copies: a stall in blocking mode (compute has nothing queued meanwhile), a reclaim
        wait at a reclaimed release's site."""
        start = time.perf_counter()
        yield
        self.totals[kind] += time.perf_counter() - start

    def collect(self) -> dict[str, float]:
        """Add the recorded pairs the device is past to the totals (the others wait for a later collect) and return
        the totals."""
        pairs, self._pairs = self._pairs, []
        for kind, start, end in pairs:
            if not end.query():
                self._pairs.append((kind, start, end))
                continue
            self.totals[kind] += start.elapsed_time(end) / 1e3  # ms -> s
        return dict(self.totals)
