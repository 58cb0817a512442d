"""Python's garbage collector and the step's time: how long it ran inside each step, and (`train.gc`) where it may
run. A step of DeepCompile on a small model is host-bound (the host's calls take nearly as long as the device's
work), and a collection that lands inside it, a full one scanning every object of the model, the engine and the
compiled graphs, adds its pause to that step's time: noise that moves with the heap, not with the design.

- `auto` (default): Python's own thresholds decide; `gc_s` and `gc_collections` say what landed in each step.
- `between_steps`: automatic collection off from step 0, and a full collection before each step's opening sync,
  outside every step's time (torchtitan turns automatic collection off for the same reason and collects every
  few steps). Full, so cyclic garbage holding device tensors is freed each step as Python would free it.
"""
from __future__ import annotations

import gc
import time
from typing import Any, Callable

from harness.contract import steps


class GcClock:
    """Seconds and collections of the garbage collector since the last `reset`, from `gc.callbacks`."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self._started: float | None = None
        self._seconds = 0.0
        self._collections = 0

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = self._clock()
        elif self._started is not None:
            self._seconds += self._clock() - self._started
            self._collections += 1
            self._started = None

    def __enter__(self) -> "GcClock":
        gc.callbacks.append(self._on_collection)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._on_collection)

    def reset(self) -> None:
        self._seconds, self._collections = 0.0, 0

    def step_stats(self) -> dict[str, float | int]:
        """The step fields whose source is "gc": what ran since the last reset."""
        values = {"gc_s": self._seconds, "gc_collections": self._collections}
        return {field.name: values[field.name] for field in steps.fields("gc")}


class GcPolicy:
    """`train.gc`: `before_step` runs where the step loop is between two steps, before the opening sync."""

    def __init__(self, policy: str, collect: Callable[[], Any] = gc.collect,
                 disable: Callable[[], None] = gc.disable, enable: Callable[[], None] = gc.enable):
        self.policy = policy
        self._collect, self._disable, self._enable = collect, disable, enable

    def __enter__(self) -> "GcPolicy":
        if self.policy == "between_steps":
            self._disable()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.policy == "between_steps":
            self._enable()

    def before_step(self) -> None:
        if self.policy == "between_steps":
            self._collect()
