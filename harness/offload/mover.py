"""Runtime copies of optimizer states between device memory and pinned host buffers.

Stream discipline (the compute stream is the current stream when an op runs):
- offload: the D2H stream waits for the compute stream (the optimizer step wrote the states there) and for the
  state's own reload, if nothing has waited for it yet; the freed device block is tied to the D2H stream with
  record_stream, so the allocator hands it out again only once the copy has read it.
- reload: the device buffer is allocated from the compute stream's pool (same sizes, same order every step, so
  the pool settles instead of growing); the H2D stream waits for the compute stream before writing it (the
  block's previous owner may still be reading) and for this state's own offload event (not for all copies).
  No record_stream on reload buffers: the compute stream waits on the reload event before any kernel reads the
  state, and the buffer is only freed by a later offload whose D2H stream waited on the compute stream.
- `split` uses separate D2H and H2D streams so out-going and in-coming copies overlap; `single` shares one.
- hold (release=ordered): instead of record_stream, the slot keeps the device block after the copy starts;
  `release` makes the compute stream wait for that copy and drops the block, so the allocator hands it to the
  next compute-stream allocation in stream order, independent of how far the host runs ahead of the device
  (with record_stream it can reuse the block only once the host sees the copy done, and maps new memory
  meanwhile). A reload of a slot still holding its block just points the state back at it: no copy.
- reclaim (release=reclaimed): the block is freed with record_stream as above; `reclaim` waits on the host for the
  copy that reads it, so the allocator, which checks a record_stream block's copy only when a request comes,
  finds it done at the next request and hands the block out instead of mapping new memory.
Nothing here waits on the host except `evict_all` (compile time), the blocking mode's `synchronize` and `reclaim`,
which its release sites call where the plan needs a block back.
Every compute-stream wait and every copy is timed on the device (stalls.py); `copy_delay_us` (debug) makes the
copy stream sleep on the device before each copy, so a missing stream wait shows up as a wrong result.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterable, Protocol

import torch

from harness.offload.stalls import D2H_BUSY, H2D_BUSY, RECLAIM_WAIT, StallRecorder
from harness.offload.states import Task


class Device(Protocol):
    """The accelerator calls the mover needs; CudaDevice is the real one."""

    def current_stream(self) -> Any: ...
    def new_stream(self) -> Any: ...
    def new_event(self, timing: bool = False) -> Any: ...
    def use_stream(self, stream: Any) -> contextlib.AbstractContextManager: ...
    def pinned_like(self, tensor: torch.Tensor) -> torch.Tensor: ...
    def device_like(self, host: torch.Tensor) -> torch.Tensor: ...
    def keep_until_done(self, tensor: torch.Tensor, stream: Any) -> None: ...
    def empty_cache(self) -> None: ...
    def sleep_us(self, microseconds: int) -> None: ...
    def allocated_bytes(self) -> int: ...
    def reserved_bytes(self) -> int: ...


class CudaDevice:
    def __init__(self, device: torch.device):
        self.device = device
        self._cycles: float | None = None  # device clock cycles per microsecond, for sleep_us

    def current_stream(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def new_stream(self) -> torch.cuda.Stream:
        return torch.cuda.Stream(self.device)

    def new_event(self, timing: bool = False) -> torch.cuda.Event:
        return torch.cuda.Event(enable_timing=timing)

    def use_stream(self, stream: torch.cuda.Stream) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(stream)

    def pinned_like(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)

    def device_like(self, host: torch.Tensor) -> torch.Tensor:
        return torch.empty(host.shape, dtype=host.dtype, device=self.device)

    def keep_until_done(self, tensor: torch.Tensor, stream: torch.cuda.Stream) -> None:
        tensor.record_stream(stream)

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def allocated_bytes(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def reserved_bytes(self) -> int:
        return torch.cuda.memory_reserved(self.device)

    def sleep_us(self, microseconds: int) -> None:
        """Keep the current stream busy for about this long (a device-side spin; the host goes on)."""
        torch.cuda._sleep(int(microseconds * self._cycles_per_us()))

    def _cycles_per_us(self) -> float:
        if self._cycles is None:  # measured once: the spin counts clock cycles, whose rate varies by GPU
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(10_000_000)
            end.record()
            end.synchronize()
            self._cycles = 10_000_000 / (start.elapsed_time(end) * 1e3)
        return self._cycles


@dataclass(eq=False)
class TaskSlot:
    """One task's runtime state: its host buffer (allocated once) and the events of its last copies."""
    task: Task
    host: torch.Tensor | None = None
    offload_event: Any = None          # recorded after the last D2H copy
    reload_event: Any = None           # recorded after the last H2D copy
    reload_unwaited: bool = False      # the compute stream has not waited on reload_event yet
    held: torch.Tensor | None = None   # hold mode: the device block, kept until release() or a reload

    @property
    def on_host(self) -> bool:
        return self.host is not None and self.task.tensor.data_ptr() == self.host.data_ptr()


class StateMover:
    def __init__(self, device: Device, split_streams: bool = True, hold: bool = False, copy_delay_us: int = 0):
        self.device = device
        self.d2h = device.new_stream()
        self.h2d = device.new_stream() if split_streams else self.d2h
        self.hold = hold
        self.copy_delay_us = copy_delay_us
        self.timer = StallRecorder(device)

    def _copy(self, stream: Any, kind: str, target: torch.Tensor, source: torch.Tensor) -> None:
        with self.device.use_stream(stream), self.timer.copy_on(stream, kind):
            if self.copy_delay_us:
                self.device.sleep_us(self.copy_delay_us)
            target.copy_(source, non_blocking=True)

    def offload(self, slots: Iterable[TaskSlot], hold: bool | None = None) -> list[TaskSlot]:
        """Start the D2H copies of the slots still on the device; returns those it started. With hold, the device
        blocks stay with the slots until release()."""
        hold = self.hold if hold is None else hold
        slots = [slot for slot in slots if not slot.on_host]
        if not slots:
            return []
        self.d2h.wait_stream(self.device.current_stream())
        for slot in slots:
            if slot.reload_unwaited:  # e.g. a skipped optimizer step: nothing waited on the reload yet
                self.d2h.wait_event(slot.reload_event)
                slot.reload_unwaited = False
            if slot.host is None:
                slot.host = self.device.pinned_like(slot.task.tensor)
            device_data = slot.task.tensor.data
            self._copy(self.d2h, D2H_BUSY, slot.host, device_data)
            if hold:
                slot.held = device_data
            else:
                self.device.keep_until_done(device_data, self.d2h)
            slot.task.tensor.data = slot.host
            if slot.offload_event is None:
                slot.offload_event = self.device.new_event()
            slot.offload_event.record(self.d2h)
        return slots

    def release(self, slot: TaskSlot) -> bool:
        """Hold mode: give the slot's device block back in stream order (the compute stream waits for the copy
        that reads it). True if it held one."""
        if slot.held is None:
            return False
        self.timer.compute_waits(slot.offload_event)
        slot.held = None
        return True

    def reclaim(self, slot: TaskSlot) -> bool:
        """Wait on the host for the copy out of a slot on the host, so the allocator's next request can reuse the block
        it freed (record_stream). True if it waited."""
        if not slot.on_host or slot.offload_event is None:
            return False
        with self.timer.host_wait(RECLAIM_WAIT):
            slot.offload_event.synchronize()
        return True

    def reload(self, slot: TaskSlot) -> bool:
        """Start the H2D copy of one slot if it is on the host; True if it started one. A slot still holding its
        device block (never released) is pointed back at it instead: the block still has the values."""
        if not slot.on_host:
            return False
        if slot.held is not None:
            # the optimizer will write the block: its (now unneeded) copy out must have read it first
            self.timer.compute_waits(slot.offload_event)
            slot.task.tensor.data, slot.held = slot.held, None
            return False
        compute = self.device.current_stream()
        buffer = self.device.device_like(slot.host)  # from the compute stream's pool
        self.h2d.wait_stream(compute)
        if slot.offload_event is not None:
            self.h2d.wait_event(slot.offload_event)
        self._copy(self.h2d, H2D_BUSY, buffer, slot.host)
        if slot.reload_event is None:
            slot.reload_event = self.device.new_event()
        slot.reload_event.record(self.h2d)
        slot.reload_unwaited = True
        slot.task.tensor.data = buffer
        return True

    def wait_reloaded(self, slots: Iterable[TaskSlot]) -> None:
        """Make the compute stream wait (a stream wait, not a host wait) for the slots' pending reloads."""
        pending = [slot for slot in slots if slot.reload_unwaited]
        if not pending:
            return
        for slot in pending:
            self.timer.compute_waits(slot.reload_event)
            slot.reload_unwaited = False

    def synchronize(self) -> None:
        """Host wait for every copy issued so far (blocking mode, compile-time eviction)."""
        with self.timer.host_wait():
            self.d2h.synchronize()
            if self.h2d is not self.d2h:
                self.h2d.synchronize()

    def evict_all(self, slots: Iterable[TaskSlot]) -> int:
        """Compile time: copy every slot out and wait, so profiling sees the emptied device. Returns bytes moved."""
        slots = list(slots)
        for slot in slots:  # blocks still held from the last step go too
            self.release(slot)
        started = self.offload(slots, hold=False)
        self.synchronize()
        return sum(slot.task.nbytes for slot in started)
