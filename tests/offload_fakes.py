"""CPU stand-ins for the offload runtime's tests: a device whose streams and events log what they are asked to do,
and a ZeRO-3-shaped optimizer."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch


class FakeClock:
    """Device time in ms: a wait of the compute stream on an event costs `wait_ms`; a device sleep its length."""

    def __init__(self):
        self.now_ms = 0.0
        self.wait_ms = 0.0


class FakeStream:
    def __init__(self, name: str, log: list, clock: FakeClock | None = None):
        self.name, self.log, self.clock = name, log, clock or FakeClock()

    def wait_stream(self, other: "FakeStream") -> None:
        self.log.append(("wait_stream", self.name, other.name))

    def wait_event(self, event: "FakeEvent") -> None:
        self.log.append(("wait_event", self.name, event.name))
        if self.name == "compute":
            self.clock.now_ms += self.clock.wait_ms

    def synchronize(self) -> None:
        self.log.append(("synchronize", self.name))


class FakeEvent:
    def __init__(self, name: str, log: list, timing: bool = False):
        self.name, self.log, self.timing = name, log, timing
        self.time_ms: float | None = None
        self.recorded = False
        self.pending = False  # a test holds a recorded event back: the device is not past it yet

    def record(self, stream: FakeStream) -> None:
        self.recorded = True
        if self.timing:  # timing events are the recorder's: kept out of the log the stream-order tests read
            self.time_ms = stream.clock.now_ms
        else:
            self.log.append(("record", self.name, stream.name))

    def synchronize(self) -> None:
        assert self.recorded, "synchronize on an event never recorded"
        if not self.timing:  # a host wait on a copy's event (the recorder's own reads stay out of the log)
            self.log.append(("host_wait", self.name))

    def query(self) -> bool:
        """Whether the device is past the event: once recorded, unless a test holds it back (`pending`)."""
        return self.recorded and not self.pending

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.timing and end.timing, "elapsed_time needs timing events"
        return end.time_ms - self.time_ms


class FakeDevice:
    """Host and "device" are both CPU memory; the mover tells them apart by which buffer a tensor views."""

    def __init__(self):
        self.log: list = []
        self.clock = FakeClock()
        self.compute = FakeStream("compute", self.log, self.clock)
        self._streams = 0
        self._events = 0
        self.timing_events: list[FakeEvent] = []  # the recorder's, in the order made
        self.pinned_allocations = 0
        self.empty_cache_calls = 0
        self.active_stream = self.compute
        self.allocated = self.reserved = 0  # what the allocator reports, set by a test

    def current_stream(self) -> FakeStream:
        return self.active_stream

    def new_stream(self) -> FakeStream:
        self._streams += 1
        return FakeStream(f"copy{self._streams}", self.log, self.clock)

    def new_event(self, timing: bool = False) -> FakeEvent:
        if timing:
            self.timing_events.append(FakeEvent("timing", self.log, timing=True))
            return self.timing_events[-1]
        self._events += 1
        return FakeEvent(f"event{self._events}", self.log)

    @contextlib.contextmanager
    def use_stream(self, stream: FakeStream):
        previous, self.active_stream = self.active_stream, stream
        try:
            yield
        finally:
            self.active_stream = previous

    def pinned_like(self, tensor: torch.Tensor) -> torch.Tensor:
        self.pinned_allocations += 1
        return torch.empty(tensor.shape, dtype=tensor.dtype)

    def device_like(self, host: torch.Tensor) -> torch.Tensor:
        self.log.append(("allocate", self.active_stream.name, host.numel()))
        return torch.empty(host.shape, dtype=host.dtype)

    def keep_until_done(self, tensor: torch.Tensor, stream: FakeStream) -> None:
        self.log.append(("record_stream", stream.name, tensor.numel()))

    def empty_cache(self) -> None:
        self.empty_cache_calls += 1

    def allocated_bytes(self) -> int:
        return self.allocated

    def reserved_bytes(self) -> int:
        return self.reserved

    def sleep_us(self, microseconds: int) -> None:
        self.log.append(("sleep_us", self.active_stream.name, microseconds))
        self.clock.now_ms += microseconds / 1e3


class FakeZero3Optimizer:
    """The parts of DeepSpeedZeroOptimizer_Stage3 the offload code reads: fp32 flat partitions per sub-group, the
    inner optimizer's state keyed by them, `_prepare_sub_group` and `_release_sub_group`."""

    def __init__(self, sub_group_numels=(6, 4), states=("exp_avg", "exp_avg_sq")):
        generator = torch.Generator().manual_seed(0)
        self.fp32_partitioned_groups_flat = [torch.randn(n, generator=generator) for n in sub_group_numels]
        self.optimizer = SimpleNamespace(state={
            flat: {"step": torch.tensor(3.0), **{key: torch.randn(flat.numel(), generator=generator)
                                                  for key in states}}
            for flat in self.fp32_partitioned_groups_flat})
        self.prepared: list[int] = []
        self.released: list[int] = []

    def _prepare_sub_group(self, sub_group_id, timer_names):
        self.prepared.append(sub_group_id)

    def _release_sub_group(self, sub_group_id, timer_names):
        self.released.append(sub_group_id)

    def step(self) -> None:
        """Each sub-group's turn, as ZeRO-3's step() takes them: prepare, update the states in place, release."""
        for sub_group_id, flat in enumerate(self.fp32_partitioned_groups_flat):
            self._prepare_sub_group(sub_group_id, set())
            flat.add_(1.0)
            for value in self.optimizer.state[flat].values():
                value.add_(1.0)
            self._release_sub_group(sub_group_id, set())

    def snapshot(self) -> list[torch.Tensor]:
        return [tensor.clone() for flat in self.fp32_partitioned_groups_flat
                for tensor in [flat, *self.optimizer.state[flat].values()]]


class FakeAccumulatingEngine:
    """A DeepSpeed engine's gradient-accumulation bookkeeping (managed accumulation): every step() advances the
    micro-step counter; the optimizer steps on the last of `accumulation` micro-batches."""

    def __init__(self, accumulation: int):
        self.micro_steps = 0
        self.accumulation = accumulation

    def gradient_accumulation_steps(self) -> int:
        return self.accumulation

    def is_gradient_accumulation_boundary(self) -> bool:
        return (self.micro_steps + 1) % self.accumulation == 0

    def step(self) -> None:
        self.micro_steps += 1


def init_deepspeed_on_cpu(monkeypatch) -> None:
    """DeepSpeed's communication layer, world size 1 over gloo (initialized once per process; the rank variables
    are set for every test, since deepspeed.initialize reads them)."""
    import socket

    import deepspeed

    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(key, value)
    if torch.distributed.is_initialized():
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        monkeypatch.setenv("MASTER_PORT", str(sock.getsockname()[1]))
    deepspeed.init_distributed(dist_backend="gloo")
