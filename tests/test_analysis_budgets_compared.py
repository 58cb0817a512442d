"""One arm at two budgets in one sweep: the capacity campaign's pass at its device rule (no budget) and at DeepSpeed's
auto budget (offload.budget_gb=12.8), beside DeepSpeed's pass at its auto budget. Each table and figure keeps the two
apart under labels that name the budget, and the comparison with DeepSpeed's pass is given twice, each saying on
what footing: each pass at its own default, and both passes at one budget."""
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

matplotlib.use("Agg")

from analysis import capacity  # noqa: E402
from analysis.bench import comparison_lines  # noqa: E402
from analysis.design import design  # noqa: E402
from analysis.fixtures.synthetic import write_point  # noqa: E402
from analysis.load import load_sweep  # noqa: E402
from analysis.measurement import comparison_table, measurement_table, retries_per_step  # noqa: E402
from analysis.tables import budget_table, throughput_table  # noqa: E402
from harness.contract import stats  # noqa: E402

pytestmark = pytest.mark.usefixtures("close_figures")
SIZE = 16.0
DS_AUTO_GB = 12.8  # DeepSpeed's margin rule on the emulated 16 GB: 16 x (1 - 0.2)
DEVICE_RULE_GB = 14.94  # what our device rule planned against
WARM_UP = (5.0, 0.3, 0.3)  # phase 0 of a compiled arm
OOM_P1 = {"stage": "step", "phase": 1, "step": 4, "requested_bytes": 2 * 10**9, "free_bytes": 5 * 10**8,
          "limit_bytes": int(SIZE * 1e9), "reserved_bytes": 15 * 10**9, "allocated_bytes": 14 * 10**9,
          "message": "CUDA out of memory"}
OVER = 13.5e9  # peak allocated of the one point that went over 12.8 GB


def steps(base):
    return tuple(base * (1 + 0.01 * k) for k in (0, 2, -1, 1, -2, 0))


# (arm, budget_gb) -> seq_len -> its runs: measured step times, or how it failed; ours at 12.8 GB went over its
# budget at 2048 (a point that did not keep its budget is no point of it).
LADDER = {
    ("ds_offload", None): {1024: [steps(0.14), steps(0.142), steps(0.139)], 2048: [steps(0.21)],
                           4096: [steps(0.35)], 8192: [OOM_P1]},
    ("offload", None): {1024: [steps(0.078), steps(0.079), steps(0.077)], 2048: [steps(0.083)],
                        4096: [steps(0.156)], 8192: [steps(0.384)]},
    ("offload", DS_AUTO_GB): {1024: [steps(0.1), steps(0.101), steps(0.099)], 2048: [steps(0.11)],
                              4096: [steps(0.2)], 8192: [steps(0.5)]},
}
OURS_DEVICE, OURS_AT = "offload (device rule)", "offload @ 12.8 GB"


def write_ladder(sweep_dir: Path, ladder=LADDER, first_job=0, extra=None, **common):
    job = first_job
    for (arm, budget_gb), points in ladder.items():
        for seq_len, runs in points.items():
            for repeat, run in enumerate(runs):
                failed = isinstance(run, dict)
                over = arm == "offload" and budget_gb is not None and seq_len == 2048
                write_point(sweep_dir, job, arm=arm, budget_gb=budget_gb, seq_len=seq_len, repeat=repeat,
                            device_memory_gb=SIZE, status="oom" if failed else "ok", oom=run if failed else None,
                            phase_times=[WARM_UP] if failed else [WARM_UP, (5.0, *run)],
                            resolved_budget_gb=None if budget_gb is not None else (
                                DS_AUTO_GB if arm == "ds_offload" else DEVICE_RULE_GB),
                            extra={**({"offload.auto_rule": "device_limit"} if arm == "offload" else {}),
                                   **(extra or {})},
                            step_values={"peak_allocated_bytes": int(OVER if over else 9e9)}, **common)
                job += 1
    return job


@pytest.fixture(scope="module")
def points_and_steps(tmp_path_factory):
    sweep_dir = tmp_path_factory.mktemp("two_budgets")
    write_ladder(sweep_dir)
    sweep = load_sweep(sweep_dir)
    return sweep.points, sweep.steps


def test_the_capacity_table_keeps_our_two_budgets_apart_and_names_them(points_and_steps):
    points, _ = points_and_steps
    table = capacity.capacity_table(points, SIZE)
    assert table.display.values.tolist() == [
        ["ds_offload", "0.14 [0.139, 0.142]", "0.21", "0.35", "OOM (p1)", "4096"],
        [f"{OURS_AT}, over budget by 0.70 GB in 1 of 6 runs", "0.1 [0.099, 0.101]", "0.11", "0.2", "0.5", "8192"],
        [OURS_DEVICE, "0.078 [0.077, 0.079]", "0.083", "0.156", "0.384", "8192"],
    ]


def test_the_frontier_and_peak_figures_draw_one_series_per_budget(points_and_steps):
    points, _ = points_and_steps
    for plot in (capacity.frontier_plot(points, SIZE), capacity.peak_reserved_plot(points, SIZE)):
        drawn = plot.data[plot.data["kind"] != "device"]
        series = {name: sorted(rows["x"]) for name, rows in drawn[drawn["kind"] != "first_oom"].groupby("series")}
        assert series[OURS_DEVICE] == series[f"{OURS_AT}, over budget by 0.70 GB in 1 of 6 runs"] == \
            [1024, 2048, 4096, 8192]
        labels = [text.get_text() for text in plot.figure.legends[0].get_texts()]
        assert OURS_DEVICE in labels and any(label.startswith(OURS_AT) for label in labels)


def test_measurement_and_throughput_rows_name_the_budget(points_and_steps):
    points, steps_frame = points_and_steps
    labels = measurement_table(points, steps_frame).display[("", "arm")].tolist()
    assert f"{OURS_DEVICE}, seq_len=1024" in labels and f"{OURS_AT}, seq_len=1024" in labels
    assert not any("budget_gb" in label for label in labels)
    throughput = throughput_table(points).display[("", "arm")].tolist()
    assert OURS_DEVICE in throughput and any(label.startswith(OURS_AT) for label in throughput)


def test_the_budget_table_still_names_the_budget_by_its_own_column(points_and_steps):
    points, _ = points_and_steps
    labels = budget_table(points).display[("", "arm")].tolist()
    assert "offload, seq_len=1024, auto (device rule)" in labels and "offload, seq_len=1024" in labels
    assert "ds_offload, seq_len=1024, auto (margin rule)" in labels
    # the one point over its budget is flagged on its own row, not on the device rule's at that length
    assert "offload, seq_len=2048, over budget by 0.70 GB" in labels
    assert "offload, seq_len=2048, auto (device rule)" in labels


def runs_of(arm, budget_gb, seq_len):
    return [list(run) for run in LADDER[(arm, budget_gb)][seq_len]]


EACH_DEFAULT, ONE_BUDGET = "(a) each pass at its own default", "(b) both passes at one budget (12.8 GB)"


def test_ours_against_deepspeeds_pass_is_given_on_both_footings_with_the_estimators_intervals(points_and_steps):
    table = comparison_table(*points_and_steps)
    peer = table.values[table.values["against"].str.startswith("ds_offload")]
    assert list(zip(peer["point"], peer["against"], peer["budgets"])) == [
        (f"{OURS_DEVICE}, seq_len=1024", "ds_offload, seq_len=1024", EACH_DEFAULT),
        (f"{OURS_DEVICE}, seq_len=2048", "ds_offload, seq_len=2048", EACH_DEFAULT),
        (f"{OURS_DEVICE}, seq_len=4096", "ds_offload, seq_len=4096", EACH_DEFAULT),
        # 2048 went over its budget: no comparison at it
        (f"{OURS_AT}, seq_len=1024", "ds_offload, seq_len=1024", ONE_BUDGET),
        (f"{OURS_AT}, seq_len=4096", "ds_offload, seq_len=4096", ONE_BUDGET),
    ]
    for budget_gb, footing in ((None, EACH_DEFAULT), (DS_AUTO_GB, ONE_BUDGET)):
        row = peer[(peer["budgets"] == footing) & peer["point"].str.endswith("seq_len=1024")].iloc[0]
        expected = stats.ratio_interval(runs_of("offload", budget_gb, 1024), runs_of("ds_offload", None, 1024))
        assert (row["ratio"], row["ci95_low"], row["ci95_high"]) == (expected.ratio, expected.low, expected.high)
        assert row["runs"] == "3×6 / 3×6"
    assert table.display[("", "budgets")].tolist()[:len(peer)] == peer["budgets"].tolist()


def test_only_like_points_are_set_against_each_other_on_either_footing(tmp_path):
    """DeepSpeed's pass at another seed or micro-batch is no peer of ours, whatever the budgets."""
    ladder = {key: {1024: runs[1024]} for key, runs in LADDER.items()}
    job = write_ladder(tmp_path, {("offload", None): ladder[("offload", None)],
                                  ("offload", DS_AUTO_GB): ladder[("offload", DS_AUTO_GB)]})
    job = write_ladder(tmp_path, {("ds_offload", None): ladder[("ds_offload", None)]}, job, micro_batch=4)
    write_ladder(tmp_path, {("ds_offload", None): ladder[("ds_offload", None)]}, job, extra={"train.seed": 1})
    sweep = load_sweep(tmp_path)
    assert len(sweep.points) == 12
    assert comparison_table(sweep.points, sweep.steps).values.empty


def test_a_sweep_with_one_footing_keeps_its_table_as_it_was(points_and_steps):
    points, steps_frame = points_and_steps
    one_budget = points[~((points["arm"] == "offload") & points["budget_gb"].isna())]
    table = comparison_table(one_budget, steps_frame)
    assert "budgets" not in table.values and ("", "budgets") not in table.display
    assert [label for label in design(one_budget).shown["offload"]] == ["seq_len"]
    assert table.values["point"].tolist()[0] == "offload, seq_len=1024"


def test_harness_bench_names_the_footing_of_each_line(tmp_path):
    write_ladder(tmp_path, {key: {1024: runs[1024]} for key, runs in LADDER.items()})
    lines = comparison_lines(load_sweep(tmp_path)).splitlines()
    assert [line.split(":")[0] for line in lines[1:]] == [
        f"  {OURS_DEVICE} / ds_offload, {EACH_DEFAULT}",
        f"  {OURS_AT} / ds_offload, {ONE_BUDGET}"]


def test_repeats_run_with_sweep_resume_fold_into_the_first_repeats_point(tmp_path):
    """The GPU queue runs each campaign with sweep.resume=true (experiments/README): how a point was run, not what
    it is, so the repeats added that way are repeats of the committed point, not a design point of their own."""
    runs = LADDER[("offload", DS_AUTO_GB)][1024]
    job = write_ladder(tmp_path, {("offload", DS_AUTO_GB): {1024: runs[:1]}})
    for repeat, run in enumerate(runs[1:], start=1):
        write_point(tmp_path, job + repeat, arm="offload", budget_gb=DS_AUTO_GB, seq_len=1024, repeat=repeat,
                    device_memory_gb=SIZE, phase_times=[WARM_UP, (5.0, *run)], extra={"sweep.resume": True})
    sweep = load_sweep(tmp_path)
    assert design(sweep.points).keys == ["arm"]
    [runs_cell] = measurement_table(sweep.points, sweep.steps).display[("", "runs")].tolist()
    assert runs_cell == "3/3 ok"


def test_each_line_states_both_points_retries_per_step_beside_the_ratio(tmp_path):
    """The retries each side's measured steps made (their mean; '-' where a run recorded none) stand beside the ratio,
    since a retry is a flush that slows the step it falls on."""
    for job, (arm, retries) in enumerate((("offload", 0), ("ds_offload", 2), ("ds_offload", None))):
        write_point(tmp_path, job, arm=arm, seq_len=1024, repeat=0 if retries is not None else 1,
                    device_memory_gb=SIZE, phase_times=[WARM_UP, (5.0, *steps(0.1 if arm == "offload" else 0.2))],
                    resolved_budget_gb=DS_AUTO_GB if arm == "ds_offload" else DEVICE_RULE_GB,
                    extra={"offload.auto_rule": "device_limit"} if arm == "offload" else {},
                    step_values={"alloc_retries": retries})
    sweep = load_sweep(tmp_path)
    table = comparison_table(sweep.points, sweep.steps)
    assert table.values["retries_per_step"].tolist() == [0.0]
    assert table.values["against_retries_per_step"].tolist() == [2.0]
    assert table.display[("", "retries/step (point / against)")].tolist() == ["0.00 / 2.00"]
    # a run whose steps recorded no retries (a CPU run, one before the counter) counts for none
    assert retries_per_step([pd.DataFrame({"step_time_s": [0.1, 0.1]})]) is None
    assert retries_per_step([pd.DataFrame({"step_time_s": [0.1, 0.1], "alloc_retries": [None, 3]})]) == 3.0


def test_points_compared_across_arms_share_the_settings_the_sweep_varies_for_every_arm(tmp_path):
    """retry_fix's shape: both passes at two optimizer sub-group sizes. Each of ours is set against DeepSpeed's pass
    at its own size only: a ratio across sizes would mix the size's effect into the passes'."""
    job = 0
    for size, ours_s, theirs_s in ((100_000_000, 0.09, 0.21), (25_000_000, 0.086, 0.209)):
        for arm, seconds in (("offload", ours_s), ("ds_offload", theirs_s)):
            write_point(tmp_path, job, arm=arm, budget_gb=11, device_memory_gb=12,
                        phase_times=[WARM_UP, (5.0, *steps(seconds))], extra={"train.sub_group_size": size})
            job += 1
    sweep = load_sweep(tmp_path)
    rows = comparison_table(sweep.points, sweep.steps).values
    assert len(rows) == 2
    for _, row in rows.iterrows():
        assert row["point"].split("=")[-1] == row["against"].split("=")[-1], (row["point"], row["against"])
