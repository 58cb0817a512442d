"""What the machine was doing while a point was measured, read at the start and at the end of its measured steps:
per GPU its SM clock, temperature, power, the reasons its clocks are held down and the processes holding its memory
(NVML, through nvidia-ml-py, as the field reads them); the host's load. Identical GPUs differ by several percent and
a neighbour's job skews both time and memory, so a point records what it ran beside. A reading never fails a run:
where NVML or a GPU is missing it says so."""
from __future__ import annotations

import os
from typing import Any, Sequence

from harness.contract.units import GB

CLOCK_DROP_LIMIT = 0.10  # an SM clock this much lower at the end than at the start of the measured steps
# NVML's reasons for lower clocks that are not the GPU idling or the usual power management at full load.
SLOWDOWNS = {"hw_slowdown": 0x8, "sw_thermal": 0x20, "hw_thermal": 0x40, "hw_power_brake": 0x80}


def host_reading() -> dict[str, Any]:
    """The host's 1-minute load average against its CPU count."""
    return {"load_1min": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}


def gpu_reading(uuid: str | None) -> dict[str, Any]:
    """One GPU's state by its UUID ('GPU-...'); {"available": False, "why": ...} without a GPU or NVML."""
    if uuid is None:
        return {"available": False, "why": "no GPU"}
    try:
        import pynvml
    except ImportError:
        return {"available": False, "why": "nvidia-ml-py is not installed"}
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        reasons = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
        return {
            "available": True, "uuid": uuid, "name": pynvml.nvmlDeviceGetName(handle),
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "temperature_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,
            "memory_used_bytes": pynvml.nvmlDeviceGetMemoryInfo(handle).used,
            "processes": [{"pid": process.pid, "used_bytes": process.usedGpuMemory}
                          for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)],
            "slowdowns": [name for name, bit in SLOWDOWNS.items() if reasons & bit],
        }
    except pynvml.NVMLError as error:
        return {"available": False, "why": f"NVML: {error}"}


def reading(uuid: str | None) -> dict[str, Any]:
    """One rank's reading: its GPU (by UUID; None on a CPU run) and its host."""
    return {"gpu": gpu_reading(uuid), "host": host_reading()}


def flags(start: Sequence[dict], end: Sequence[dict], own_pids: Sequence[int]) -> list[str]:
    """What makes a point's measurement suspect, per rank (readings in rank order): its SM clock fell by more than
    CLOCK_DROP_LIMIT, NVML named a slowdown, or a process other than the point's ranks held memory on its GPU. Each
    flag starts with its check's name (`clock: ...`), which the report shows."""
    out = []
    ranks_on = {}  # GPU UUID -> how many of the point's ranks use it
    for gpu in (reading["gpu"] for reading in start if reading["gpu"]["available"]):
        ranks_on[gpu["uuid"]] = ranks_on.get(gpu["uuid"], 0) + 1
    for rank, (first, last) in enumerate(zip(start, end)):
        first, last = first["gpu"], last["gpu"]
        if not (first["available"] and last["available"]):
            continue
        if last["sm_clock_mhz"] < (1 - CLOCK_DROP_LIMIT) * first["sm_clock_mhz"]:
            out.append(f"clock: rank {rank}'s SM clock fell from {first['sm_clock_mhz']} to "
                       f"{last['sm_clock_mhz']} MHz")
        slowdowns = sorted(set(first["slowdowns"]) | set(last["slowdowns"]))
        if slowdowns:
            out.append(f"slowdown: rank {rank}'s clocks were slowed ({', '.join(slowdowns)})")
        others = max(_foreign_bytes(gpu, own_pids, ranks_on[first["uuid"]]) for gpu in (first, last))
        if others:
            out.append(f"neighbour: another process held {others / GB:.2f} GB of rank {rank}'s GPU")
    return out


def _foreign_bytes(gpu: dict, own_pids: Sequence[int], own_count: int) -> int:
    """Memory held on the GPU by compute processes that are none of the point's ranks. NVML may list no processes at
    all, and inside a container it lists them by the host's pids: no more processes than the point's ranks on the GPU
    means no neighbour."""
    if len(gpu["processes"]) <= own_count:
        return 0
    return sum(process["used_bytes"] or 0 for process in gpu["processes"] if process["pid"] not in own_pids)
