"""Budgets kept or flagged (harness/contract/budget.py): a point whose plan is infeasible or whose measured peak
passes its budget says so in summary.json, in every table and in `harness bench`, and is no point of that budget
in a comparison at one budget; `offload.if_infeasible=refuse` stops it at planning, recorded config_error."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.bench import load_points, report
from analysis.fixtures.synthetic import write_point
from analysis.load import load_sweep
from analysis.measurement import comparison_table, measurement_table
from harness.contract import runfiles
from harness.contract.budget import over_budget_bytes, recorded_over_budget_bytes
from harness.contract.errors import ConfigError, PlanRefused, refusal_in
from harness.driver.launch import LaunchResult, classify

RESULTS = Path(__file__).resolve().parents[1] / "results"
GB = 10**9


def test_over_budget_is_the_further_of_the_predicted_and_the_measured_peak_past_the_budget():
    assert over_budget_bytes(11 * GB, 12_290_000_000, 12_280_000_000) == 1_290_000_000
    assert over_budget_bytes(11 * GB, 10 * GB, 11_500_000_000) == 500_000_000  # a feasible plan that ran over
    assert over_budget_bytes(11 * GB, None, 10 * GB) == 0
    assert over_budget_bytes(None, 12 * GB, 12 * GB) is None  # no budget: nothing to keep


def test_a_summary_from_before_the_key_is_flagged_from_its_plan_and_steps():
    steps = [{"phase": 0, "phase_step": 0, "peak_allocated_bytes": 20 * GB},  # the compile step does not count
             {"phase": 0, "phase_step": 1, "peak_allocated_bytes": 12 * GB}]
    old = {"status": "ok", "budget_bytes": 11 * GB, "predicted_peak_bytes": None}
    assert recorded_over_budget_bytes(old, steps) == 1 * GB
    assert recorded_over_budget_bytes({**old, "status": "oom"}, steps) == 0  # a run that did not finish: its status
    assert recorded_over_budget_bytes({**old, "over_budget_bytes": 0}, steps) == 0  # recorded: as recorded


@pytest.mark.skipif(not (RESULTS / "wide_limit" / "sweep").exists(), reason="no wide_limit results committed")
def test_wide_limits_points_are_flagged_in_every_committed_table_and_not_compared_at_their_budget():
    tables = sorted((RESULTS / "wide_limit" / "report" / "tables").glob("*.md"))
    assert len(tables) > 10
    assert "comparison.md" not in {table.name for table in tables}  # no pair kept the budget both were run at
    for table in tables:
        rows = [line for line in table.read_text().splitlines() if line.startswith("| ")][1:]  # below the header
        rows = [row for row in rows if "offload" in row]
        assert rows, table.name
        assert all("over budget by 1.29 GB" in row for row in rows), table.name


def test_a_point_over_its_budget_is_labelled_so_and_left_out_of_the_comparison_at_one_budget(tmp_path):
    for repeat in range(2):  # both arms at budget 8 GB, ours allocating 9 GB: over by 1 GB
        write_point(tmp_path, 2 * repeat, arm="ds_offload", budget_gb=8, repeat=repeat,
                    phase_times=((5.0, *[0.2] * 6),), step_values={"peak_allocated_bytes": 7 * GB})
        write_point(tmp_path, 2 * repeat + 1, arm="offload", budget_gb=8, repeat=repeat,
                    phase_times=((5.0, *[0.1] * 6),), step_values={"peak_allocated_bytes": 9 * GB})
    sweep = load_sweep(tmp_path)
    labels = list(measurement_table(sweep.points, sweep.steps).display[("", "arm")])
    assert labels == ["ds_offload", "offload, over budget by 1.00 GB"]
    assert comparison_table(sweep.points, sweep.steps).values.empty
    assert "over budget by 1.00 GB" in report(load_points([tmp_path]))


def test_bench_compares_losses_only_with_a_like_reference(tmp_path):
    """A reference at another accumulation is no reference: the line says there is none."""
    write_point(tmp_path, 0, arm="deepcompile", grad_accum=1)
    write_point(tmp_path, 1, arm="offload", budget_gb=8, grad_accum=4)
    write_point(tmp_path, 2, arm="offload", budget_gb=8, grad_accum=1)
    lines = [line for line in report(load_points([tmp_path])).splitlines() if line.startswith("  offload")]
    assert len(lines) == 2
    assert "no reference of the same model, shape, accumulation, dtype and seed" in lines[0]
    assert "max rel loss diff vs deepcompile 0.00e+00" in lines[1]


def test_a_refused_plan_is_found_behind_the_compilers_wrapping_and_recorded_config_error(tmp_path):
    refused = PlanRefused(12_290_000_000, 11 * GB, 1)
    assert isinstance(refused, ConfigError) and refused.key == "offload.if_infeasible"
    assert "1.29 GB short" in refused.message and "before phase 1's step 0" in refused.message
    wrapped = RuntimeError("backend compiler failed")
    wrapped.inner_exception = refused  # as torch's BackendCompilerFailed holds it
    try:
        try:
            raise wrapped
        except RuntimeError as error:
            raise ValueError("while compiling") from error
    except ValueError as outer:
        assert refusal_in(outer) is refused
    assert refusal_in(ValueError("other")) is None
    (tmp_path / runfiles.rank_error(0)).write_text(json.dumps({"kind": "config_error", "rank": 0,
                                                          "message": f"PlanRefused: {refused}"}))
    status, reason = classify(LaunchResult(returncode=1, timed_out=False, wall_time_s=1.0), tmp_path, 2, 10)
    assert status == "config_error" and "1.29 GB short" in reason


def test_a_line_over_points_that_went_over_by_different_amounts_names_the_largest_as_up_to(tmp_path):
    """A figure's line along the budget covers every budget's point: where they went over by different amounts, its
    note gives the largest as 'up to', where one amount covers them all, as it is."""
    from analysis.design import design

    for index, (budget, peak) in enumerate(((8, 9), (9, 9.5), (10, 9.5))):  # over by 1 GB, 0.5 GB, kept
        write_point(tmp_path, index, arm="offload", budget_gb=budget,
                    phase_times=((5.0, *[0.1] * 6),), step_values={"peak_allocated_bytes": int(peak * GB)})
    points = load_sweep(tmp_path).points
    line = design(points).over_budget_note(points.iloc[0].to_dict(), leave_out=["budget_gb"])
    assert line == "over budget by up to 1.00 GB in 2 of 3 runs"
    assert design(points).over_budget_note(points.iloc[1].to_dict()) == "over budget by 0.50 GB"
