"""Where a campaign's device time went: each run's wall time split into start-up, compile steps, other steps and
the rest, per design point, and the device minutes of the whole campaign."""
from __future__ import annotations

import json

import pandas as pd

from analysis.fixtures.synthetic import write_point
from analysis.load import load_sweep
from analysis.wall_time import wall_time_table
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


def test_repeats_a_sweep_kept_from_starting_neither_pull_the_medians_to_zero_nor_count_as_runs(tmp_path):
    run_dir = write_point(tmp_path, 0, arm="offload", repeat=0, phase_times=((5.0, 1.0),))
    set_summary(tmp_path, run_dir, wall_time_s=100.0, startup_s=20.0)
    for repeat in (1, 2):  # sweep.stop_at left no time to start them: skipped, wall 0
        kept_out = write_point(tmp_path, repeat, arm="offload", repeat=repeat, status="skipped", phase_times=())
        set_summary(tmp_path, kept_out, wall_time_s=0.0)
    sweep = load_sweep(tmp_path)
    table = wall_time_table(sweep.points, sweep.steps)
    ours = table.values.iloc[0]
    assert (ours["wall_time_s"], ours["startup_s"], ours["compile_s"], ours["n_runs"]) == (100.0, 20.0, 5.0, 1)
    assert table.display.iloc[0][("", "runs")] == "1 (+2 skipped)"


def first_step(phase: int, **seconds) -> dict:
    return {"phase": phase, "step_time_s": 1.0, "lazy_backward_s": None, "pass_s": None, **seconds}


def test_runs_that_recorded_their_split_show_its_parts_and_runs_before_it_read_not_available(tmp_path):
    phases = ((50.0, 1.0, 1.0), (60.0, 1.0, 1.0, 1.0))  # ours: compile steps, then measured steps
    split = {"imports_s": 8.0, "process_group_s": 4.0, "model_s": 3.0, "engine_s": 2.0, "after_steps_s": 0.5,
             "process_s": 140.0,
             "first_steps": [first_step(0, dynamo_s=45.0, inductor_s=10.0, dc_passes_s=30.0, dc_profiling_s=25.0,
                                        pass_s=0.0),
                             first_step(1, dynamo_s=50.0, lazy_backward_s=5.0, inductor_s=12.0, dc_passes_s=40.0,
                                        dc_profiling_s=20.0, pass_s=4.0)]}
    cache = {"key": "k1", "lookups": {"0": {"hit": 2, "miss": 0}, "1": {"hit": 3, "miss": 1}}}
    ours = write_point(tmp_path, 0, arm="offload", phase_times=phases)
    set_summary(tmp_path, ours, wall_time_s=150.0, startup_s=17.0, wall_split=split, profile_cache=cache)
    before = write_point(tmp_path, 1, arm="deepcompile", phase_times=phases)
    set_summary(tmp_path, before, wall_time_s=150.0)  # recorded before the split
    sweep = load_sweep(tmp_path)
    table = wall_time_table(sweep.points, sweep.steps)
    row = table.values.set_index("arm").loc["offload"]
    assert row["split_trace_s"] == (45 - 10 - 30) + (50 + 5 - 12 - 40)  # Dynamo and AOT: what is not nested
    assert (row["split_inductor_s"], row["split_dc_profiling_s"], row["split_pass_s"]) == (22.0, 45.0, 4.0)
    assert row["split_dc_other_s"] == (30 - 25) + (40 - 20 - 4)
    assert (row["split_imports_s"], row["split_model_s"], row["split_engine_s"]) == (12.0, 3.0, 2.0)
    assert row["split_teardown_s"] == 0.5 + 150 - 140  # torchrun's start and end, the worker's after its steps
    assert (row["profiles_reused"], row["profiles_looked_up"]) == (5, 6)
    assert row["measured_pct"] == 100 * 3.0 / 150  # the final phase's steps after its compile step
    shown = table.display.set_index(("", "arm"))
    assert shown.loc["offload", ("", "DC profiling (s)")] == "25.0 + 20.0"  # each phase's
    assert shown.loc["offload", ("", "profiles reused")] == "5/6"
    for title in ("trace (s)", "DC profiling (s)", "imports (s)", "torchrun + end (s)", "profiles reused"):
        assert shown.loc["deepcompile", ("", title)] == "-"
    assert shown.loc["all points", ("", "measured (%)")] == "2.0"  # 6 s of 300


def test_a_table_of_runs_recorded_before_the_split_has_no_split_columns(tmp_path):
    run_dir = write_point(tmp_path, 0, arm="offload", phase_times=((5.0, 1.0, 1.0),))
    set_summary(tmp_path, run_dir, wall_time_s=60.0)
    sweep = load_sweep(tmp_path)
    table = wall_time_table(sweep.points, sweep.steps)
    titles = [title for _, title in table.display.columns]
    assert "trace (s)" not in titles and "profiles reused" not in titles
    assert titles[-2:] == ["device (min)", "measured (%)"]


def test_bench_prints_the_device_minutes_and_the_share_in_measured_steps(tmp_path):
    from analysis.wall_time import device_time_line

    for job, status in ((0, "ok"), (1, "oom")):
        run_dir = write_point(tmp_path, job, arm="offload", repeat=job, status=status,
                              phase_times=((10.0, 2.0, 4.0),))
        set_summary(tmp_path, run_dir, wall_time_s=60.0)
    sweep = load_sweep(tmp_path)
    assert device_time_line(sweep.points, sweep.steps) == "== device time: 2.0 min over 2 runs, 5.0% of it in " \
                                                          "measured steps"


def test_bench_reads_what_a_point_that_reused_the_sweeps_profiles_cost_against_one_that_made_them(tmp_path):
    """A budget sweep's cost reading: three later points took DeepCompile's profiles from the sweep's cache, the first
    made them; a point that looked nothing up (an eager arm) and a failed one count in neither."""
    from analysis.wall_time import device_time_line

    points = [(0, "ok", 100.0, {"0": {"hit": 0, "miss": 4}}), (1, "ok", 40.0, {"0": {"hit": 4, "miss": 0}}),
              (2, "ok", 50.0, {"0": {"hit": 4, "miss": 0}}), (3, "ok", 45.0, {"0": {"hit": 4, "miss": 0}}),
              (4, "oom", 10.0, {"0": {"hit": 4, "miss": 0}}), (5, "ok", 20.0, None)]
    for job, status, wall, lookups in points:
        run_dir = write_point(tmp_path, job, arm="offload", repeat=job, status=status, phase_times=((10.0, 2.0, 4.0),))
        set_summary(tmp_path, run_dir, wall_time_s=wall,
                    profile_cache=None if lookups is None else {"key": "k1", "lookups": lookups})
    sweep = load_sweep(tmp_path)
    line = device_time_line(sweep.points, sweep.steps)
    assert line.endswith("; a point that reused DeepCompile's profiles took 0.45× the wall of one that made them "
                         "(median 45.0 s over 3 runs, against 100.0 s over 1)"), line


def test_bench_says_nothing_of_reuse_where_no_point_reused(tmp_path):
    from analysis.wall_time import device_time_line

    run_dir = write_point(tmp_path, 0, arm="offload", phase_times=((10.0, 2.0, 4.0),))
    set_summary(tmp_path, run_dir, wall_time_s=60.0, profile_cache={"key": "k1", "lookups": {"0": {"miss": 4}}})
    sweep = load_sweep(tmp_path)
    assert "reused" not in device_time_line(sweep.points, sweep.steps)


def test_repeats_that_profiled_different_graphs_are_flagged_and_runs_recorded_before_the_graphs_are_not(tmp_path):
    """summary.json's profile_cache.graphs (each profiled graph's fingerprint, per phase): a point whose runs
    profiled different graph sets (DeepCompile scheduled each from its own profile) says how many in its flags; one
    whose runs profiled the same graphs, or recorded none, says nothing of them."""
    from analysis.measurement import measurement_table

    phases = ((5.0, 1.0, 1.0, 1.0),)
    same, differ = {"0": ["profile-aaa", "memory-bbb"]}, {"0": ["profile-aaa", "memory-ccc"]}
    for job, (arm, repeat, graphs) in enumerate((("offload", 0, same), ("offload", 1, differ), ("offload", 2, same),
                                                 ("ds_offload", 0, same), ("ds_offload", 1, same),
                                                 ("deepcompile", 0, None), ("deepcompile", 1, None))):
        run_dir = write_point(tmp_path, job, arm=arm, repeat=repeat, phase_times=phases)
        cache = {"key": "k", "lookups": {"0": {"miss": 2}}, **({} if graphs is None else {"graphs": graphs})}
        set_summary(tmp_path, run_dir, profile_cache=cache)
    sweep = load_sweep(tmp_path)
    flags = {row[("", "arm")]: row[("", "flags")]
             for row in measurement_table(sweep.points, sweep.steps).display.to_dict("records")}
    assert "runs profiled 2 different graph sets" in flags["offload"], flags
    assert "graph sets" not in flags["ds_offload"] and "graph sets" not in flags["deepcompile"], flags
