"""What a traced step's memory_trace.json (`debug.memory_trace_step`, harness/rank/memory_trace.py) says of its
allocator retries, as a reader of someone else's run dir needs it: how many retries the step had, and for those
the trace lists, the one-word reading of why each request missed.

The readings, the first that holds for a retry (memory_trace.retry_reading):
- "deferred": blocks freed under record_stream, not yet reusable, would have held the request;
- "fragmentation": the free cache of the request's own stream would have, but no block there was large enough;
- "other_stream": only the free cache of all streams together would have (a stream cannot use another's blocks);
- "headroom": the live bytes left too little room under the limit.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.contract import safe_read

RETRY_READINGS = ("deferred", "fragmentation", "other_stream", "headroom")


@dataclass(frozen=True)
class RetryTrace:
    """One traced step's retries: `retries` in all, `readings` counted over the first ones the trace lists (it
    keeps at most 20), the largest request that missed among them, and the largest free block its stream had then
    (None where the trace predates that record)."""
    retries: int
    readings: Mapping[str, int]
    largest_miss_bytes: int | None
    free_at_largest_miss_bytes: int | None = None

    @property
    def listed(self) -> int:
        return sum(self.readings.values())


class NotARetryTrace(ValueError):
    """memory_trace.json holds no readable retry record."""


def retry_trace(trace: Any) -> RetryTrace:
    """The retry record of a parsed memory_trace.json; NotARetryTrace where it has none or a malformed one."""
    if not isinstance(trace, Mapping):
        raise NotARetryTrace("not a JSON object")
    count, listed = trace.get("retry_count"), trace.get("retries")
    if not _whole(count) or not isinstance(listed, list) or len(listed) > count:
        raise NotARetryTrace("no retry_count (a whole number) with at most as many retries listed")
    readings = {reading: 0 for reading in RETRY_READINGS}
    missed: list[tuple[int, int | None]] = []  # (bytes requested, the largest free block on its stream)
    for retry in listed:
        reading = retry.get("reading") if isinstance(retry, Mapping) else None
        request = retry.get("missed") if isinstance(retry, Mapping) else None
        size = request.get("bytes") if isinstance(request, Mapping) else None
        if reading not in readings or not _whole(size):
            raise NotARetryTrace(f"a retry without a reading ({', '.join(RETRY_READINGS)}) and the bytes it missed")
        readings[reading] += 1
        missed.append((size, _largest_free(retry)))
    largest = max(missed, key=lambda pair: pair[0], default=(None, None))
    return RetryTrace(count, readings, *largest)


def _largest_free(retry: Mapping[str, Any]) -> int | None:
    before = retry.get("before")
    free = before.get("largest_free_block_bytes") if isinstance(before, Mapping) else None
    if free is not None and not _whole(free):
        raise NotARetryTrace("a largest free block that is not a whole number of bytes")
    return free


def read_retry_trace(path: Path, root: Path | None = None) -> RetryTrace | None:
    """The retry record of a run dir's memory_trace.json, None without the file; safe_read.RefusedFile, OSError,
    ValueError (not JSON) or NotARetryTrace for a file that is not one."""
    return safe_read.read_optional_json(path, root, retry_trace)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
