"""What a rank measures of each step beside its time: the device memory monitor, the arm's counters as per-step
values, and the record combined over ranks, each as the step fields declare (harness/contract/steps.py)."""
from __future__ import annotations

from typing import Any, Callable

import torch

from harness.contract import steps

# The step's segments the monitor reads peaks for, in order: forward + backward (to engine.backward's return),
# then the optimizer step. Every arm's step record has `<segment>_peak_allocated_bytes`.
SEGMENTS = ("fwd_bwd", "opt_step")


def physical_total_bytes(device: torch.device) -> int | None:
    """The real device's memory (None on CPU)."""
    return torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None


class MemoryMonitor:
    """Per-step device memory peaks, per segment of the step (SEGMENTS), and allocator events (None everywhere on
    a CPU run). `emulated_bytes` is the emulated device size (env.device_memory_gb), which every memory-aware
    decision sees instead of the real one."""

    def __init__(self, device: torch.device, emulated_bytes: int | None = None):
        self.cuda = device.type == "cuda"
        self.device = device
        self.emulated_bytes = emulated_bytes
        self._retries = self._ooms = 0
        self._segments: dict[str, tuple[int, int]] = {}  # this step's closed segments: (allocated, reserved) peaks
        if self.cuda:
            stats = torch.cuda.memory_stats(device)
            self._retries, self._ooms = stats.get("num_alloc_retries", 0), stats.get("num_ooms", 0)

    def reset_peaks(self) -> None:
        """A step starts: its peaks count from here."""
        self._segments = {}
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def end_segment(self, segment: str) -> None:
        """Close a segment of the step (SEGMENTS; with gradient accumulation each micro-batch closes each once, and
        the segment keeps its highest peaks) and start counting the next one's peaks from here."""
        if not self.cuda:
            return
        allocated, reserved = self._segments.get(segment, (0, 0))
        peak_allocated, peak_reserved = _peaks(torch.cuda.memory_stats(self.device))
        self._segments[segment] = (max(allocated, peak_allocated), max(reserved, peak_reserved))
        torch.cuda.reset_peak_memory_stats(self.device)

    def device_total_bytes(self) -> int | None:
        """The device size decisions are made against: the emulated one, else the real one."""
        return self.emulated_bytes if self.emulated_bytes is not None else physical_total_bytes(self.device)

    def used_outside_torch_bytes(self) -> int | None:
        """Device memory in use that this process's allocator does not hold: the CUDA context, other processes.
        DeepCompile adds it to every profiled peak, so another job on the same GPU skews the offload plans."""
        if not self.cuda:
            return None
        free, total = torch.cuda.mem_get_info(self.device)
        return total - free - torch.cuda.memory_reserved(self.device)

    def step_stats(self) -> dict[str, int | None]:
        """The step's peaks (over its segments and whatever ran after the last one), each segment's allocated peak,
        and allocator retries/OOMs since the last call: the step fields whose source is the monitor."""
        if not self.cuda:
            return dict.fromkeys(field.name for field in steps.fields("monitor"))
        stats = torch.cuda.memory_stats(self.device)
        retries, ooms = stats.get("num_alloc_retries", 0), stats.get("num_ooms", 0)
        peaks = [*self._segments.values(), _peaks(stats)]
        out = {"peak_allocated_bytes": max(allocated for allocated, _ in peaks),
               "peak_reserved_bytes": max(reserved for _, reserved in peaks),
               **{f"{segment}_peak_allocated_bytes": self._segments[segment][0] if segment in self._segments else None
                  for segment in SEGMENTS},
               "alloc_retries": retries - self._retries, "ooms": ooms - self._ooms}
        self._retries, self._ooms = retries, ooms
        return out


def _peaks(stats: dict) -> tuple[int, int]:
    """(allocated, reserved) peaks since torch's last peak reset, from `torch.cuda.memory_stats`."""
    return stats.get("allocated_bytes.all.peak", 0), stats.get("reserved_bytes.all.peak", 0)


class ArmCounters:
    """The arm's step fields (source "arm") for each step: a cumulative counter as this step's delta, a reading as
    read; None for an arm without counters, or a field it does not report."""

    def __init__(self, read: Callable[[], dict] | None):
        self._read = read
        self._last = self._read() if self._read else {}

    def step_values(self) -> dict[str, int | float | None]:
        arm_fields = steps.fields("arm")
        if self._read is None:
            return dict.fromkeys(field.name for field in arm_fields)
        now = self._read()
        values = {field.name: _step_value(field, now, self._last) for field in arm_fields}
        self._last = now
        return values


def _step_value(field: steps.StepField, now: dict, last: dict) -> int | float | None:
    if field.name not in now:
        return None
    return now[field.name] - last.get(field.name, 0) if field.cumulative else now[field.name]


_REDUCE_OPS = {"max": "MAX", "min": "MIN", "mean": "SUM"}  # a mean is the sum over ranks, divided below


def aggregate_over_ranks(record: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The record combined over ranks as each field declares (`StepField.ranks`): max for time and memory, min for
    the offload counts (> 0 proves every rank ran them), the mean for the loss. A no-op for world size 1."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return record
    out = dict(record)
    for how, op in _REDUCE_OPS.items():
        present = [field.name for field in steps.fields() if field.ranks == how and record.get(field.name) is not None]
        if not present:
            continue
        values = torch.tensor([float(record[name]) for name in present], dtype=torch.float64, device=device)
        dist.all_reduce(values, op=getattr(dist.ReduceOp, op))
        for name, value in zip(present, values.tolist()):
            if how == "mean":
                out[name] = value / dist.get_world_size()
            else:
                out[name] = value if isinstance(record[name], float) else int(value)
    return out
