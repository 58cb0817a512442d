"""Opt-in looks inside one optimizer step on rank 0, for when a number needs explaining.

- `debug.profile_step=K`: a torch.profiler trace of step K (host, and device with CUDA), written as
  `torch_trace.json` (Chrome trace: https://ui.perfetto.dev) and `torch_ops.txt` (operators by self host time,
  then, with CUDA, by self device time: an op that costs only host time, such as ours, shows in the first).
- `debug.memory_trace_step=K`: the caching allocator's history during step K, or during `debug.memory_trace_steps`
  steps from K as one trace (CUDA only; memory_trace.py).
Both slow the steps they look at: their times in steps.jsonl are not measurements.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from harness.rank import memory_trace
from harness.contract import runfiles
from harness.contract.schema.groups import DebugConfig

logger = logging.getLogger(__name__)

TABLE_ROWS = 40


class StepDiagnostics:
    """Starts and stops the requested recorders around a step (call `before` after the step-start sync and
    `after` after the step-end sync, so they cover exactly one step)."""

    def __init__(self, debug: DebugConfig, rank: int, cuda: bool):
        self.cuda = cuda
        self.profile_step = debug.profile_step if rank == 0 else None
        first = debug.memory_trace_step if rank == 0 else None
        if first is not None and not cuda:
            logger.warning("worker: debug.memory_trace_step needs CUDA (it traces the caching allocator); "
                           "no trace written")
            first = None
        # The traced steps, first to last: one recording spans them all.
        self.memory_steps = range(first, first + debug.memory_trace_steps) if first is not None else range(0)
        self._profiler: torch.profiler.profile | None = None

    def traces(self, step: int) -> bool:
        """Whether a recorder runs during this step (its time is then left out of the medians)."""
        return step == self.profile_step or step in self.memory_steps

    def before(self, step: int, device: torch.device) -> None:
        if self.memory_steps and step == self.memory_steps[0]:
            memory_trace.start(device)
        if step == self.profile_step:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profiler = torch.profiler.profile(activities=activities)
            self._profiler.start()

    def after(self, step: int, device: torch.device, run_dir: Path) -> None:
        if step == self.profile_step and self._profiler is not None:
            self._profiler.stop()
            self._write_profile(run_dir)
            self._profiler = None
        if self.memory_steps and step == self.memory_steps[-1]:
            memory_trace.stop_and_write(run_dir, device, self.memory_steps)

    def _write_profile(self, run_dir: Path) -> None:
        runfiles.write_atomic(run_dir / runfiles.TORCH_TRACE, lambda tmp: self._profiler.export_chrome_trace(str(tmp)))
        averages = self._profiler.key_averages()
        orders = ["self_cpu_time_total"] + (["self_device_time_total"] if self.cuda else [])
        tables = [f"operators by {order}\n" + averages.table(sort_by=order, row_limit=TABLE_ROWS) for order in orders]
        runfiles.write_atomic(run_dir / runfiles.TORCH_OPS, "\n\n".join(tables) + "\n")
