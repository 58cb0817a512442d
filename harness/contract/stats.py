"""Intervals for medians and for ratios of medians, by bootstrap (numpy's Generator resamples, percentile
intervals). Seeded, so the same step times always give the same interval and reports rebuild byte for byte.

A point's estimate is the one the tables show: the median over its runs (repeats) of each run's median over its
measured steps. Its interval resamples at two levels, because runs of one point differ by more than their steps do
(machine drift, another compile): first the runs, then the steps within each run drawn. With one run that is the
plain bootstrap of its median. A comparison of two points divides their estimates, resampled independently.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 10_000
SEED = 0


def median_of_runs(runs: Sequence[Sequence[float]]) -> float:
    """A point's estimate: the median over its runs of each run's median."""
    return float(np.median([np.median(run) for run in runs]))


def _two_level_estimates(runs: Sequence[Sequence[float]], rng: np.random.Generator, resamples: int) -> np.ndarray:
    """`resamples` bootstrap estimates of median_of_runs: runs drawn with replacement, then each drawn run's steps."""
    k = len(runs)
    # Each run's medians over independent step resamples, one per (resample, slot) a draw of runs may put it in.
    run_medians = np.stack([
        np.median(np.asarray(run, dtype=float)[rng.integers(0, len(run), size=(resamples, k, len(run)))], axis=2)
        for run in runs])  # (run, resample, slot)
    drawn = rng.integers(0, k, size=(resamples, k))  # which run each slot of each resample holds
    picked = run_medians[drawn, np.arange(resamples)[:, None], np.arange(k)[None, :]]
    return np.median(picked, axis=1)


def _percentiles(estimates: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(estimates, [tail, 100 - tail])
    return float(low), float(high)


def _resamplable(runs: Sequence[Sequence[float]]) -> list[Sequence[float]]:
    """The runs a bootstrap can resample: those of two steps or more."""
    return [run for run in runs if len(run) >= 2]


def runs_interval(runs: Sequence[Sequence[float]], confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                  seed: int = SEED) -> tuple[float, float] | None:
    """median_of_runs's two-level bootstrap interval; None where no run has two steps."""
    runs = _resamplable(runs)
    if not runs:
        return None
    return _percentiles(_two_level_estimates(runs, np.random.default_rng(seed), resamples), confidence)


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                    seed: int = SEED) -> tuple[float, float] | None:
    """One run's median's bootstrap interval over its measured steps; None for fewer than two."""
    return runs_interval([values], confidence, resamples, seed)


@dataclass(frozen=True)
class Ratio:
    """A's estimate over B's with its bootstrap interval; `runs` and `steps` say how much each side measured."""
    ratio: float
    low: float
    high: float
    runs: tuple[int, int]
    steps: tuple[int, int]  # the fewest measured steps of a run, per side

    @property
    def verdict(self) -> str:
        """Whether the interval excludes 1, and which way (for step times: A slower or faster than B)."""
        if self.low > 1:
            return "slower"
        if self.high < 1:
            return "faster"
        return "no difference"

    @property
    def sizes(self) -> str:
        """`3×20 / 3×20`: runs × measured steps per run, per side."""
        return " / ".join(f"{runs}×{steps}" for runs, steps in zip(self.runs, self.steps))

    def text(self) -> str:
        """`0.790× [0.760, 0.820], n = 3×20 / 3×20`."""
        return f"{ratio_text(self.ratio, self.low, self.high)}, n = {self.sizes}"


def interval_text(low: float, high: float) -> str:
    """`[0.760, 0.820]`: a ratio's interval as every table and console line prints it."""
    return f"[{low:.3f}, {high:.3f}]"


def ratio_text(ratio: float, low: float, high: float) -> str:
    """`0.790× [0.760, 0.820]`."""
    return f"{ratio:.3f}× {interval_text(low, high)}"


def ratio_interval(runs_a: Sequence[Sequence[float]], runs_b: Sequence[Sequence[float]],
                   confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = SEED) -> Ratio | None:
    """A / B of median_of_runs with a two-level bootstrap interval; None where a side has no run of two steps."""
    runs_a, runs_b = _resamplable(runs_a), _resamplable(runs_b)
    if not runs_a or not runs_b:
        return None
    rng_a, rng_b = (np.random.default_rng(stream) for stream in np.random.SeedSequence(seed).spawn(2))
    estimates = _two_level_estimates(runs_a, rng_a, resamples) / _two_level_estimates(runs_b, rng_b, resamples)
    low, high = _percentiles(estimates, confidence)
    return Ratio(median_of_runs(runs_a) / median_of_runs(runs_b), low, high, (len(runs_a), len(runs_b)),
                 (min(map(len, runs_a)), min(map(len, runs_b))))
