"""The measurement protocol: how many optimizer steps a point runs, which of them are measured, and whether the
measured steps were steady.

Every phase begins with a compile step (DeepCompile compiles; an eager arm warms up) and `train.warmup_steps` more
steps, all left out of the phase's statistics; the final phase then has `train.measure_steps` measured steps. The
total follows from where the arm's final phase starts, so one config gives every arm the same measured count
(`deepcompile`'s final phase starts at step 5, our pass's at 2, DeepSpeed's pass's at 1). `train.steps` sets the
total instead, for whoever wants it; the two are never set together.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:  # the schema imports this module
    from harness.contract.schema.groups import TrainConfig

# Steadiness: a point whose measured steps drift, whose reserved memory still grows, or whose allocator retries
# on most steps has not reached the steady state its median claims to describe.
TREND_LIMIT = 0.03  # the halves' medians may differ by this fraction of the first half's
MIN_STEPS_TO_JUDGE = 6  # fewer measured steps say nothing about a trend (each half needs three)


@dataclass(frozen=True)
class StepCounts:
    """A point's optimizer steps: `total` run, the final phase from `final_start`, `warmup` steps after each
    phase's compile step left out, and `measured` final-phase steps in the statistics."""
    total: int
    final_start: int
    warmup: int
    measured: int

    @property
    def first_measured(self) -> int:
        """The final phase's first measured step (== total when it measures none)."""
        return self.final_start + 1 + self.warmup


def step_counts(train: TrainConfig, phase_starts: Sequence[int]) -> StepCounts:
    """The step counts of a validated train group, given the steps where the arm's phases begin."""
    warmup = train.warmup_steps
    if train.steps is None:
        final_start = phase_starts[-1]
        return StepCounts(final_start + 1 + warmup + train.measure_steps, final_start, warmup, train.measure_steps)
    total = train.steps
    final_start = max(start for start in phase_starts if start < total)  # the last phase the run reaches
    return StepCounts(total, final_start, warmup, max(0, total - (final_start + 1 + warmup)))


def with_step_counts(written: dict[str, Any], counts: StepCounts) -> dict[str, Any]:
    """The config (as config.yaml holds it) as the point runs it: train.steps is the total and train.measure_steps
    the final phase's measured count, whichever of the two the user set."""
    return {**written, "train": {**written["train"], "steps": counts.total, "measure_steps": counts.measured}}


def is_measured(row: Mapping[str, Any], warmup: int) -> bool:
    """A step of its phase's statistics: past the compile step and the warm-up, and not slowed by a debug trace."""
    return row["phase_step"] > warmup and not row.get("traced")


def steadiness(measured: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """`steady` (None where too few steps were measured to judge) and `steady_reasons`, why it is not: the measured
    steps' time trends, reserved memory still grows in their last third, or the allocator retried on most of them.
    Each reason starts with its check's name (`trend: ...`), which the report shows."""
    n = len(measured)
    if n < MIN_STEPS_TO_JUDGE:
        return {"steady": None,
                "steady_reasons": [f"few steps: {n} measured steps are too few to judge ({MIN_STEPS_TO_JUDGE} needed)"]}
    reasons = []
    times = [row["step_time_s"] for row in measured]
    first, second = statistics.median(times[: n // 2]), statistics.median(times[n - n // 2:])
    if abs(second - first) > TREND_LIMIT * first:
        reasons.append(f"trend: the second half's median step time is {second / first - 1:+.1%} off the first's")
    reserved = [row.get("peak_reserved_bytes") for row in measured]
    if all(value is not None for value in reserved):
        last_third = n - n // 3
        growth = max(reserved[last_third:]) - max(reserved[:last_third])
        if growth > 0:
            reasons.append(f"reserved: peak reserved memory still grows in the last third of the measured steps "
                           f"(+{growth / 1e6:.0f} MB)")
    retried = sum(1 for row in measured if (row.get("alloc_retries") or 0) > 0)
    if retried > n / 2:
        reasons.append(f"retries: the allocator retried on {retried} of {n} measured steps")
    return {"steady": not reasons, "steady_reasons": reasons}
