"""sweep.stop_at: a sweep starts no point it could not finish by then, going by what its recorded points took;
such a point is recorded `skipped` (not a success) and a later call with sweep.resume=true runs it
(harness/driver/stop_at.py). In process through the driver's record_point with the launch replaced, as
tests/test_resume.py does, and once through the real driver, two calls of one sweep."""
import json
import time
from pathlib import Path

import pytest

from conftest import harness_run, replace_launch
from harness.config.compose import compose_point
from harness.contract import runfiles
from harness.contract.runfiles import read_jsonl
from harness.contract.errors import ConfigError
from harness.driver import app, stop_at
from harness.driver.validate import validate

PLACE = app.nodes.NodePlace(node_rank=0, nnodes=1, hosts=("localhost",))
POINT = ["model=tiny", "logger=none", "train.warmup_steps=0", "train.measure_steps=3"]


@pytest.fixture
def launched(monkeypatch) -> list[Path]:
    return replace_launch(monkeypatch, wall_time_s=100.0)  # each launch records a wall time of 100 s


def record(run_dir: Path, *overrides: str) -> str:
    run_dir.mkdir(parents=True, exist_ok=True)
    return app.record_point(compose_point([*POINT, *overrides]), run_dir, PLACE, sweep_dir=run_dir.parent)


def test_a_point_that_could_not_finish_in_time_is_skipped_and_a_later_call_runs_it(tmp_path, launched):
    first, second = tmp_path / "0_first", tmp_path / "1_second"
    soon = f"sweep.stop_at={time.time() + 60}"  # 60 s left: less than the 100 s the first point took
    assert record(first, soon) == "ok"  # nothing recorded yet to go by: the first point starts
    assert record(second, soon, "sweep.resume=true") == "skipped"
    assert launched == [first]
    summary = json.loads((second / runfiles.SUMMARY).read_text())
    assert summary["status"] == "skipped" and "a point of this sweep takes 100 s here" in summary["reason"]
    assert (second / runfiles.CONFIG).is_file()

    later = f"sweep.stop_at={time.time() + 600}"
    assert record(first, later, "sweep.resume=true") == "ok"  # kept: stop_at does not change what a point measured
    assert record(second, later, "sweep.resume=true") == "ok"
    assert launched == [first, second]


def finished(sweep_dir: Path, name: str, wall: float, startup: float | None = None, boot: str | None = None,
             op_build: float | None = None) -> None:
    (sweep_dir / name).mkdir()
    runfiles.write_json(sweep_dir / name / runfiles.SUMMARY, {
        "status": "ok", "wall_time_s": wall, **({"startup_s": startup} if startup else {}),
        **({"op_build_s": op_build} if op_build is not None else {})})
    if boot is not None:
        runfiles.write_json(sweep_dir / name / runfiles.ENV, {"boot_id": boot})


def test_without_start_ups_recorded_the_time_needed_is_the_longest_wall_a_sibling_recorded(tmp_path):
    for name, wall in (("0_a", 80.0), ("1_b", 130.5), ("2_c", 0.0)):
        finished(tmp_path, name, wall)
    (tmp_path / "3_bad").mkdir()
    (tmp_path / "3_bad" / runfiles.SUMMARY).write_text("[1, 2]")  # no object: tells nothing
    this = tmp_path / "4_this"
    assert stop_at.point_s_needed(stop_at.finished_points(tmp_path, this), "boot") == 130.5
    assert stop_at.reason_to_skip(None, this, tmp_path, now=0.0) is None
    assert stop_at.reason_to_skip(1000.0, this, tmp_path, now=1000.0 - 131) is None
    assert stop_at.reason_to_skip(1000.0, this, tmp_path, now=1000.0 - 130).startswith("sweep.stop_at: 130 s left")
    assert stop_at.reason_to_skip(1000.0, this, None, now=1000.0 - 130) is None  # a single run: nothing to go by
    assert stop_at.finished_points(tmp_path / "1_b", tmp_path / "1_b" / "x") == []


def test_a_machine_that_built_its_ops_in_its_first_point_is_charged_its_later_points_start_up(tmp_path):
    """As on an H100 (results/empty_cache_policies): the fresh machine's first point took 268 s, 121 s of it
    start-up (DeepSpeed's JIT ops built), the next 147 s with 26 s; a longer point of another machine counts by its
    work, not its start-up."""
    finished(tmp_path, "0_first", 268.0, startup=121.0, boot="vm1")
    this = tmp_path / "9_this"
    points = stop_at.finished_points(tmp_path, this)
    assert stop_at.point_s_needed(points, "vm1") == 268.0  # only the first ran here: its start-up may recur
    finished(tmp_path, "1_second", 147.0, startup=26.0, boot="vm1")
    points = stop_at.finished_points(tmp_path, this)
    assert stop_at.point_s_needed(points, "vm1") == 147.0 + 26.0  # the first's work, this machine's later start-up
    assert stop_at.point_s_needed(points, "vm2") == 147.0 + 121.0  # a fresh machine builds again
    assert stop_at.reason_to_skip(1000.0, this, tmp_path, now=1000.0 - 180, boot="vm1") is None
    assert stop_at.reason_to_skip(1000.0, this, tmp_path, now=1000.0 - 180, boot="vm2").endswith(
        "takes 268 s here (run it again with sweep.resume=true)")
    finished(tmp_path, "2_long", 400.0, startup=30.0, boot="vm0")  # a longer shape, on an earlier machine
    points = stop_at.finished_points(tmp_path, this)
    assert stop_at.point_s_needed(points, "vm1") == 370.0 + 26.0


def test_a_machine_whose_first_point_timed_its_op_builds_is_charged_that_start_up_less_them(tmp_path):
    """As on an H100 (results/empty_cache_policies, the repeat): the fresh machine's first point took 271 s, 120 s
    of it start-up with ~95 s of op builds, and the next call had 257 s left: a later point here takes the first's
    work and its start-up less the builds, which fits. A fresh machine still pays the builds."""
    finished(tmp_path, "0_first", 271.1, startup=120.0, boot="vm1", op_build=95.0)
    this = tmp_path / "9_this"
    points = stop_at.finished_points(tmp_path, this)
    assert stop_at.point_s_needed(points, "vm1") == pytest.approx(151.1 + 25.0)
    assert stop_at.point_s_needed(points, "vm2") == pytest.approx(271.1)  # a fresh machine builds again
    assert stop_at.reason_to_skip(1000.0, this, tmp_path, now=1000.0 - 257, boot="vm1") is None
    finished(tmp_path, "1_second", 147.0, startup=26.0, boot="vm1", op_build=0.0)
    assert stop_at.point_s_needed(stop_at.finished_points(tmp_path, this), "vm1") == pytest.approx(151.1 + 26.0)
    finished(tmp_path, "2_older", 150.0, startup=20.0, boot="vm1")  # recorded before op_build_s: the old rule
    assert stop_at.point_s_needed(stop_at.finished_points(tmp_path, this), "vm1") == pytest.approx(151.1 + 26.0)


def test_a_sweeps_first_point_goes_by_the_multiruns_beside_it_and_then_by_its_own(tmp_path):
    """As on an H100 (results/empty_cache_policies, its repeat 1): a queue of campaigns, each its own multirun in
    one parent, started the next campaign's first point with 76 s left, and the call's end killed it. The
    neighbours' typical point (the median wall, less op builds once this machine has built its ops) is the guide
    until the sweep has a point of its own; a folder that is no multirun has none."""
    done, this_sweep = tmp_path / "accumulation", tmp_path / "empty_cache_policies"
    for sweep in (done, this_sweep, tmp_path / "not_a_sweep"):
        sweep.mkdir()
    for sweep in (done, this_sweep):
        (sweep / runfiles.MULTIRUN).write_text("{}")
    finished(done, "0_a", 124.0, startup=75.0, boot="vm1", op_build=50.0)  # the fresh machine's first point
    finished(done, "1_b", 96.0, startup=22.0, boot="vm1", op_build=0.0)
    finished(done, "2_c", 60.0, startup=20.0, boot="vm1", op_build=0.0)
    finished(done, "3_d", 130.0, startup=25.0, boot="vm1", op_build=0.0)
    finished(tmp_path / "not_a_sweep", "0_long", 900.0, boot="vm1")  # not a multirun: not read
    this = this_sweep / "0_this"
    reason = stop_at.reason_to_skip(1000.0, this, this_sweep, now=1000.0 - 76, boot="vm1")
    assert reason == ("sweep.stop_at: 76 s left, and a point of the sweeps beside this one typically takes 85 s "
                      "here (run it again with sweep.resume=true)")  # the median of 74, 96, 60 and 130 s
    assert stop_at.reason_to_skip(1000.0, this, this_sweep, now=1000.0 - 86, boot="vm1") is None
    assert "takes 110 s" in stop_at.reason_to_skip(1000.0, this, this_sweep, now=1000.0 - 86, boot="vm2")  # builds
    finished(this_sweep, "1_own", 60.0, startup=20.0, boot="vm1", op_build=0.0)  # its own point now rules
    assert stop_at.reason_to_skip(1000.0, this, this_sweep, now=1000.0 - 76, boot="vm1") is None
    (this_sweep / runfiles.MULTIRUN).unlink()
    (this_sweep / "1_own" / runfiles.SUMMARY).unlink()
    assert stop_at.reason_to_skip(1000.0, this, this_sweep, now=1000.0 - 76, boot="vm1") is None  # no multirun


@pytest.mark.parametrize("value,message", [("-5", "sweep.stop_at"), ("soon", "sweep.stop_at")])
def test_a_bad_stop_at_is_refused_naming_the_key(value, message):
    with pytest.raises(ConfigError, match=message):
        validate(app.resolved_or_written(compose_point([*POINT, f"sweep.stop_at={value}"]))[0], 0)


def test_stop_at_is_refused_on_several_nodes():
    resolved = app.resolved_or_written(compose_point([*POINT, "sweep.stop_at=2000000000", "launcher.nnodes=2"]))[0]
    with pytest.raises(ConfigError, match="sweep.stop_at: one node only"):
        validate(resolved, 0)


@pytest.mark.slow
def test_a_sweep_past_its_stop_at_skips_its_later_point_and_the_next_call_runs_it(tmp_path):
    sweep = ("logger=none", "train.seed=1,2")
    first = harness_run(tmp_path, *sweep, f"sweep.stop_at={time.time() + 1}", multirun=True)
    assert first.returncode == 0, first.stderr[-3000:]
    sweep_dir = tmp_path / "sweep"
    index = read_jsonl(sweep_dir / runfiles.INDEX)
    assert [line["status"] for line in index] == ["ok", "skipped"]  # the first starts: nothing to go by yet
    assert "skipped: sweep.stop_at: 0 s left" in first.stderr

    second = harness_run(tmp_path, *sweep, f"sweep.stop_at={time.time() + 3600}", "sweep.resume=true",
                         multirun=True)
    assert second.returncode == 0, second.stderr[-3000:]
    assert [line["status"] for line in read_jsonl(sweep_dir / runfiles.INDEX)] == ["ok", "ok"]
    assert second.stdout.count("kept: ") == 1
