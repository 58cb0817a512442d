"""What a rank holds in host memory at each step's end: its resident set, and what torch's pinned-host allocator
holds, with the time the step spent in CUDA's pinned allocations. Offloading trades device bytes for host bytes:
ZeRO-Offload keeps the states and runs Adam on the host, the offload passes keep pinned copies of the states
there. torch's pinned allocator rounds each buffer up to a power of two, so the pinned bytes can exceed the states
moved by up to 2x; pinning is also slow (the pages are locked one by one), which shows in the step that first
pins (the first offload). A reading never fails a run: where one is missing (a CPU run has no pinned allocator,
a torch without `host_memory_stats`) its fields are null."""
from __future__ import annotations

from typing import Any, Callable

import psutil
import torch

from harness.contract import steps

PIN_TIME_KEY = "host_alloc_time.total"  # microseconds in CUDA's pinned allocations since the process started
# Pinned bytes the allocator holds (in use and cached, rounded sizes): torch up to 2.8 names them reserved_bytes
# (its allocated_bytes are those in use); later torch names them allocated_bytes (and those in use active_bytes).
PINNED_KEYS = ("reserved_bytes.current", "allocated_bytes.current")


def torch_pinned_stats() -> dict[str, Any] | None:
    """torch's pinned-host allocator statistics; None where this torch has no such reader or it reads nothing (a
    build without CUDA returns none)."""
    reader = getattr(torch.cuda, "host_memory_stats", None)
    stats = reader() if reader is not None else None
    return dict(stats) if stats else None


class HostMemoryMonitor:
    """The step fields whose source is "host", read once per step. `pinned_stats` is injectable for tests."""

    def __init__(self, cuda: bool, pinned_stats: Callable[[], dict[str, Any] | None] = torch_pinned_stats):
        self._process = psutil.Process()
        self._pinned_stats = pinned_stats if cuda else (lambda: None)
        stats = self._pinned_stats()
        self._pin_us = self._pin_time_us(stats)
        # what was pinned before the first step (ZeRO-Offload's buffers, offload.evict_from=start): worker.json
        self.at_start = {"pinned_host_bytes_at_start": _pinned_bytes(stats),
                         "pin_time_s_at_start": None if self._pin_us is None else self._pin_us / 1e6}

    def step_stats(self) -> dict[str, int | float | None]:
        stats = self._pinned_stats()
        pin_us = self._pin_time_us(stats)
        values = {"host_rss_bytes": self._process.memory_info().rss,
                  "pinned_host_bytes": _pinned_bytes(stats),
                  "pin_time_s": None if pin_us is None else (pin_us - (self._pin_us or 0)) / 1e6}
        self._pin_us = pin_us if pin_us is not None else self._pin_us
        return {field.name: values[field.name] for field in steps.fields("host")}

    @staticmethod
    def _pin_time_us(stats: dict[str, Any] | None) -> float | None:
        value = _reading(stats, PIN_TIME_KEY)
        return None if value is None else float(value)


def _reading(stats: dict[str, Any] | None, key: str) -> int | None:
    """One statistic, None where there are none or this torch names it otherwise (never a made-up 0)."""
    return None if stats is None or key not in stats else int(stats[key])


def _pinned_bytes(stats: dict[str, Any] | None) -> int | None:
    """What the pinned allocator holds, under the name this torch gives it (PINNED_KEYS)."""
    return next((_reading(stats, key) for key in PINNED_KEYS if stats is not None and key in stats), None)

