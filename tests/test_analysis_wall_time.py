"""Where a campaign's device time went: each run's wall time split into start-up, compile steps, other steps and
the rest, per design point, and the device minutes of the whole campaign."""
from __future__ import annotations

import json

import pandas as pd

from analysis.fixtures.synthetic import write_point
from analysis.load import load_sweep
from analysis.measurement import wall_time_table
from harness.contract import runfiles


def set_summary(sweep_dir, run_dir: str, **values) -> None:
    path = sweep_dir / run_dir / runfiles.SUMMARY
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))


def test_each_run_splits_its_wall_time_and_the_campaign_sums_every_run_whatever_its_status(tmp_path):
    phases = ((5.0, 1.0, 1.0), (7.0, 0.5, 0.5))  # compile steps 5 + 7 s, other steps 3 s
    for repeat, wall, startup in ((0, 75.0, 20.0), (1, 135.0, 30.0)):
        run_dir = write_point(tmp_path, repeat, arm="offload", repeat=repeat, phase_times=phases)
        set_summary(tmp_path, run_dir, wall_time_s=wall, startup_s=startup)
    ran_out = write_point(tmp_path, 2, arm="deepcompile", status="oom", phase_times=((4.0,),))
    set_summary(tmp_path, ran_out, wall_time_s=60.0)  # recorded before start-up was
    sweep = load_sweep(tmp_path)
    table = wall_time_table(sweep.points, sweep.steps)
    ours = table.values[table.values["arm"] == "offload"].iloc[0]
    assert (ours["compile_s"], ours["steps_s"], ours["startup_s"]) == (12.0, 3.0, 25.0)  # medians over the runs
    assert ours["other_s"] == 90.0 and ours["wall_time_s"] == 105.0  # (60 + 120) / 2, (75 + 135) / 2
    assert ours["device_min"] == 3.5
    theirs = table.values[table.values["arm"] == "deepcompile"].iloc[0]
    assert pd.isna(theirs["startup_s"])  # not recorded
    assert (theirs["compile_s"], theirs["other_s"], theirs["device_min"]) == (4.0, 56.0, 1.0)
    last = table.display.iloc[-1]
    assert (last[("", "arm")], last[("", "runs")], last[("", "device (min)")]) == ("all points", "3", "4.5")
    shown = table.display.set_index(("", "arm"))[("", "of it start-up (s)")]
    assert (shown["offload"], shown["deepcompile"]) == ("25.0", "-")


def test_a_sweep_whose_points_all_ran_out_before_a_step_still_counts_their_device_time(tmp_path):
    for job in range(2):
        run_dir = write_point(tmp_path, job, arm="deepcompile", repeat=job, status="oom", phase_times=())
        set_summary(tmp_path, run_dir, wall_time_s=30.0)
    sweep = load_sweep(tmp_path)
    table = wall_time_table(sweep.points, sweep.steps)
    assert table.values["compile_s"].tolist() == [0.0] and table.values["device_min"].tolist() == [1.0]
