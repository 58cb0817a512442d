"""Python's garbage collector and the step's time (harness/rank/garbage.py, train.gc): the clock times the
collections that run inside a step, and between_steps keeps them out of every step."""
from __future__ import annotations

import gc
import itertools
from pathlib import Path

import pytest
import yaml

from harness.contract import steps
from harness.contract.errors import ConfigError
from harness.contract.schema import check_fields
from harness.contract.schema.groups import TrainConfig
from harness.rank.garbage import GcClock, GcPolicy


def test_the_clock_times_each_collection_from_its_start_to_its_stop():
    ticks = itertools.count(start=10.0, step=0.25)  # each reading of the clock a quarter second later
    with GcClock(clock=lambda: next(ticks)) as clock:
        gc.collect()
        gc.collect(0)
        stats = clock.step_stats()
    assert stats == {"gc_s": 0.5, "gc_collections": 2}


def test_the_clock_counts_only_what_ran_since_its_reset_and_leaves_no_callback_behind():
    callbacks_before = list(gc.callbacks)
    with GcClock() as clock:
        gc.collect()
        clock.reset()
        assert clock.step_stats() == {"gc_s": 0.0, "gc_collections": 0}
        gc.collect()
        assert clock.step_stats()["gc_collections"] == 1 and clock.step_stats()["gc_s"] > 0
    assert gc.callbacks == callbacks_before


def test_the_clocks_values_are_the_declared_gc_step_fields():
    with GcClock() as clock:
        assert set(clock.step_stats()) == {field.name for field in steps.fields("gc")} == {"gc_s", "gc_collections"}


class Calls:
    def __init__(self):
        self.made: list[str] = []

    def policy(self, name: str) -> GcPolicy:
        return GcPolicy(name, collect=lambda: self.made.append("collect"), disable=lambda: self.made.append("off"),
                        enable=lambda: self.made.append("on"))


def test_between_steps_turns_automatic_collection_off_and_collects_before_each_step():
    calls = Calls()
    with calls.policy("between_steps") as policy:
        policy.before_step()
        policy.before_step()
    assert calls.made == ["off", "collect", "collect", "on"]


def test_auto_leaves_the_collector_to_python():
    calls = Calls()
    with calls.policy("auto") as policy:
        policy.before_step()
    assert calls.made == []


def test_between_steps_keeps_collections_out_of_the_timed_step():
    """The loop's order: the policy's collection, then the clock's reset, then the step: what the clock reads is
    what ran inside the step, and with automatic collection off nothing does."""
    with GcClock() as clock, GcPolicy("between_steps") as policy:
        policy.before_step()
        clock.reset()
        garbage = []
        for _ in range(50_000):  # far past the young generation's threshold: auto would collect here
            cycle = []
            cycle.append(cycle)
            garbage.append(cycle)
        assert clock.step_stats()["gc_collections"] == 0
    assert gc.isenabled()


def test_an_unknown_gc_policy_is_refused_naming_its_key():
    train = yaml.safe_load((Path(__file__).resolve().parents[1] / "conf" / "train" / "default.yaml").read_text())
    check_fields("train", TrainConfig, {**train, "measure_steps": 20})  # the defaults pass
    with pytest.raises(ConfigError, match="train.gc: must be one of auto, between_steps, got 'sometimes'"):
        check_fields("train", TrainConfig, {**train, "measure_steps": 20, "gc": "sometimes"})
