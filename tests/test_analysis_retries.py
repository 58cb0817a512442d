"""What allocator retries cost per point: the Theil-Sen slope of step time on retries over the measured steps, "-"
where retries do not vary or were not recorded (CPU runs), failed points by their status as in the measurement
table."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.fixtures.synthetic import write_point
from analysis.load import load_sweep
from analysis.measurement import measurement_table
from analysis.retries import retry_table, retry_values
from analysis.render import write_table
from analysis.tables import format_number

FIXTURE = Path(__file__).resolve().parents[1] / "analysis" / "fixtures" / "sweep"  # CPU: no retries recorded
COMPILE = 5.0  # each synthetic phase's first step, left out with the compile step
BASE, COST = 0.15, 0.02  # seconds a step takes without retries, and what one retry adds
RETRY_CELLS = [("", name) for name in ("retried", "retries/step", "fewest retries", "s/step at fewest", "ms/retry",
                                       "95% interval")]


def noisy_run(rng: np.random.Generator, steps: int = 30) -> tuple[list[float], list[int]]:
    """Step times base + COST × retries + a little noise, and three steps slowed by something else."""
    retries = rng.integers(0, 4, size=steps)
    times = BASE + COST * retries + rng.normal(0, 0.002, size=steps)
    times[[3, 11, 19]] += 0.3
    return times.tolist(), retries.tolist()


def with_retries(sweep_dir: Path, retries_by_job: dict[int, list[int | None]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The sweep's points and steps, each job's measured steps (after its compile step) given these retries."""
    sweep = load_sweep(sweep_dir)
    steps = sweep.steps.copy()
    steps["alloc_retries"] = steps["alloc_retries"].astype(object)
    for job, retries in retries_by_job.items():
        mine = steps["run_dir"].str.startswith(f"{job}_") & (steps["phase_step"] > 0)
        steps.loc[mine, "alloc_retries"] = pd.Series(retries, index=steps.index[mine], dtype=object)
    return sweep.points, steps


def cells(table, label):
    display = table.display
    rows = display[("", "arm")] == label
    assert rows.sum() == 1, f"no single row {label!r} in {list(display[('', 'arm')])}"
    return display.loc[rows].iloc[0]


def test_the_slope_is_what_one_retry_costs_and_its_interval_covers_it():
    covered = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        runs = [pd.DataFrame(dict(zip(("step_time_s", "alloc_retries"), noisy_run(rng)))) for _ in range(3)]
        values = retry_values(runs)
        assert values["retry_cost_s"] == pytest.approx(COST, rel=0.05)  # the three slow steps do not drag it
        covered += values["retry_cost_ci95_low"] <= COST <= values["retry_cost_ci95_high"]
    assert covered >= 36  # a 95% interval covers about 38 of 40 samples (these seeds: 37)
    assert values["steps"] == values["steps_recorded"] == 90
    pooled = pd.concat(runs)
    assert values["steps_retried"] == (pooled["alloc_retries"] > 0).sum()
    assert values["step_time_s_at_fewest"] == pooled.loc[pooled["alloc_retries"] == 0, "step_time_s"].median()


def test_a_point_pools_its_repeats_and_shows_the_cost_in_ms(tmp_path):
    rng = np.random.default_rng(1)
    retries_by_job = {}
    for repeat in range(2):
        times, retries = noisy_run(rng, steps=20)
        write_point(tmp_path, repeat, arm="offload", budget_gb=4.0, repeat=repeat, phase_times=[(COMPILE, *times)])
        retries_by_job[repeat] = retries
    table = retry_table(*with_retries(tmp_path, retries_by_job))
    row = table.values.iloc[0]
    assert row["retry_cost_ci95_low"] <= COST <= row["retry_cost_ci95_high"]
    line = cells(table, "offload")
    assert (line[("", "runs")], line[("", "measured")]) == ("2/2 ok", "2×20")
    assert line[("", "ms/retry")] == format_number(row["retry_cost_s"] * 1000)
    assert line[("", "95% interval")] == \
        f"[{format_number(row['retry_cost_ci95_low'] * 1000)}, {format_number(row['retry_cost_ci95_high'] * 1000)}]"
    fewest = sum(retries.count(0) for retries in retries_by_job.values())
    assert line[("", "fewest retries")] == f"0 ({fewest} steps)"
    assert line[("", "retried")] == f"{40 - fewest}/40"


def test_retries_that_never_vary_give_no_slope(tmp_path):
    write_point(tmp_path, 0, arm="offload", budget_gb=4.0, phase_times=[(COMPILE, 0.2, 0.3, 0.25)],
                step_values={"alloc_retries": 2})
    write_point(tmp_path, 1, arm="deepcompile", phase_times=[(COMPILE, 0.1, 0.1, 0.1)])  # alloc_retries 0 throughout
    sweep = load_sweep(tmp_path)
    table = retry_table(sweep.points, sweep.steps)
    offload, deepcompile = cells(table, "offload"), cells(table, "deepcompile")
    assert [offload[column] for column in RETRY_CELLS] == ["3/3", "2", "2 (3 steps)", "0.25", "-", "-"]
    assert [deepcompile[column] for column in RETRY_CELLS] == ["0/3", "0", "0 (3 steps)", "0.1", "-", "-"]
    assert table.values["retry_cost_s"].isna().all()


def test_points_without_recorded_retries_and_failed_points_show_dashes_and_their_status(tmp_path):
    write_point(tmp_path, 0, arm="zero3", phase_times=[(COMPILE, 0.4, 0.5, 0.6)], step_values={"alloc_retries": None})
    write_point(tmp_path, 1, arm="zero3", micro_batch=4, status="oom", phase_times=[(COMPILE,)])
    write_point(tmp_path, 2, arm="deepcompile", status="skipped", phase_times=[])
    sweep = load_sweep(tmp_path)
    for steps in (sweep.steps, sweep.steps.drop(columns="alloc_retries")):  # the column absent: older run files
        table = retry_table(sweep.points, steps)
        cpu = cells(table, "zero3, micro_batch=2")
        assert [cpu[column] for column in RETRY_CELLS] == ["-"] * len(RETRY_CELLS)
        assert (cpu[("", "measured")], cpu[("", "s/step")]) == ("1×3", "0.5")
        assert cells(table, "zero3, micro_batch=4")[("", "s/step")] == "OOM"
        assert cells(table, "deepcompile")[("", "s/step")] == "SKIPPED"


def test_on_the_cpu_fixture_the_rows_are_the_measurement_tables_and_rebuild_byte_for_byte(tmp_path):
    sweep = load_sweep(FIXTURE)
    table = retry_table(sweep.points, sweep.steps)
    shared = [("", "arm"), ("", "runs"), ("", "measured")]
    assert table.display[shared].equals(measurement_table(sweep.points, sweep.steps).display[shared])
    assert (table.display[RETRY_CELLS] == "-").all().all()
    first = write_table(table, tmp_path / "first")
    reread = load_sweep(FIXTURE)
    again = write_table(retry_table(reread.points, reread.steps), tmp_path / "again")
    assert [path.name for path in first] == ["retries.md", "retries.tex", "retries.csv", "retries_values.csv"]
    assert [path.read_bytes() for path in first] == [path.read_bytes() for path in again]
    assert first[0].read_text().startswith("*Allocator retries on the final phase's measured steps")


def test_where_runs_recorded_the_garbage_collector_its_steps_and_mean_pause_get_columns(tmp_path):
    """gc_s (train.gc) in the runs: the table adds the measured steps a collection ran in and the mean ms a step
    spent in it; a point recorded before gc_s shows '-' there."""
    write_point(tmp_path, 0, arm="zero3", phase_times=((1.0, 0.5, 0.4, 0.6),), step_values={"gc_s": 0.004})
    write_point(tmp_path, 1, arm="zero3", micro_batch=4, phase_times=((1.0, 0.5, 0.4, 0.6),))
    sweep = load_sweep(tmp_path)
    table = retry_table(sweep.points, sweep.steps)
    gc_cells = table.display[[("", "steps with GC"), ("", "GC ms/step")]].values.tolist()
    assert gc_cells == [["3/3", "4"], ["-", "-"]]
    assert table.values["steps_with_gc"].tolist()[:1] == [3]


def test_without_a_recorded_garbage_collector_the_table_has_no_gc_columns():
    sweep = load_sweep(FIXTURE)
    table = retry_table(sweep.points, sweep.steps)
    assert ("", "GC ms/step") not in table.display.columns and "gc_s_mean" not in table.values


def test_where_runs_recorded_the_hosts_wait_at_each_steps_end_the_host_paced_steps_get_columns(tmp_path):
    """end_sync_s (the step loop's closing synchronize): the table adds the measured steps the host paced (a wait
    under 1 ms) and the median wait; a point recorded before end_sync_s shows '-' there."""
    write_point(tmp_path, 0, arm="zero3", phase_times=((1.0, 0.5, 0.4, 0.6),), step_values={"end_sync_s": 0.0004})
    write_point(tmp_path, 1, arm="zero3", micro_batch=4, phase_times=((1.0, 0.5, 0.4, 0.6),),
                step_values={"end_sync_s": 0.03})
    write_point(tmp_path, 2, arm="zero3", micro_batch=8, phase_times=((1.0, 0.5, 0.4, 0.6),))
    sweep = load_sweep(tmp_path)
    table = retry_table(sweep.points, sweep.steps)
    sync_cells = table.display[[("", "host-paced steps"), ("", "end wait ms")]].values.tolist()
    assert sync_cells == [["3/3", "0.4"], ["0/3", "30"], ["-", "-"]]
    assert table.values["steps_host_paced"].tolist()[:2] == [3, 0]
    assert "host-paced steps, end wait ms" in table.caption and ("", "GC ms/step") not in table.display.columns


def test_without_a_recorded_end_wait_the_table_has_no_host_paced_columns():
    sweep = load_sweep(FIXTURE)
    table = retry_table(sweep.points, sweep.steps)
    assert ("", "end wait ms") not in table.display.columns and "end_sync_s_median" not in table.values
