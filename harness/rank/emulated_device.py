"""An emulated device size (`env.device_memory_gb`): every rank behaves as if its GPU had that many bytes, from
before the model is built to the end of the run, so a point that would not fit a smaller GPU runs out of memory
for real and is recorded `oom`.

Two seams carry the size:
- the caching allocator's ceiling (`torch.cuda.set_per_process_memory_fraction`): past it the allocator gives
  back its unused cached blocks and, if the request still does not fit, raises CUDA's out-of-memory error;
- DeepSpeed's accelerator object: `total_memory()` returns the size and `available_memory()` the size less what
  the allocator holds. DeepCompile's passes read these (prefetch, selective gather, zero3 compile and its
  rank-min total, DeepSpeed's offload pass's auto budget), and so do our auto budget and planner.
Memory outside the allocator (the CUDA context, NCCL's buffers) is not counted against the size.

`env.reserved_cap_gb` is the same allocator ceiling applied only from the final phase on: a tool to measure the
steady state under a ceiling while phase 0 (all states resident) runs unconstrained. It must not exceed the
emulated size.
"""
from __future__ import annotations

import logging
import re

from harness.contract.schema.groups import EnvConfig, check_emulated_size
from harness.contract.units import GB

logger = logging.getLogger(__name__)

_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_REQUESTED = re.compile(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)")


def size_bytes(size_gb: float | None) -> int | None:
    """The emulated device size (env.device_memory_gb) in bytes, or None for the real device."""
    return None if size_gb is None else int(size_gb * GB)


def set_allocator_ceiling(limit_bytes: int, physical_bytes: int, device) -> None:
    """Cap the caching allocator of `device` (CUDA) at `limit_bytes` of reserved memory."""
    import torch

    torch.cuda.set_per_process_memory_fraction(min(1.0, limit_bytes / physical_bytes), device)


def patch_accelerator(size: int) -> None:
    """Make DeepSpeed's accelerator report a device of `size` bytes (on CPU too, where tests read it)."""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    reserved = accelerator.memory_reserved
    accelerator.total_memory = lambda device_index=None: size
    accelerator.available_memory = lambda device_index=None: max(0, size - int(reserved(device_index) or 0))


def apply(env: EnvConfig, device, physical_bytes: int | None) -> int | None:
    """Emulate the configured size on this rank (call before anything is allocated); returns it in bytes."""
    size = size_bytes(env.device_memory_gb)
    if size is None:
        return None
    # Against the real device, which only the rank sees.
    check_emulated_size(env.device_memory_gb, env.reserved_cap_gb, physical_bytes)
    patch_accelerator(size)
    if device.type == "cuda":
        set_allocator_ceiling(size, physical_bytes, device)
    else:
        logger.info(f"worker: env.device_memory_gb={env.device_memory_gb:g}: no CUDA allocator to cap on "
                    "this machine; DeepSpeed's accelerator reports the emulated size")
    return size


def requested_bytes(message: str) -> int | None:
    """The allocation an out-of-memory error names ('Tried to allocate 2.00 GiB'), in bytes (to 2 decimals)."""
    match = _REQUESTED.search(message)
    return None if match is None else int(float(match.group(1)) * _UNITS[match.group(2)])
