"""The planner out of sample (harness/offload/out_of_sample.py, `harness plan --out-of-sample`): each profile.json of
a sweep plans the other points of its model and shape as they ran, and its predicted peak is set against theirs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from analysis.fixtures.synthetic import write_point
from analysis.load import load_sweep
from analysis.prediction import NO_PAIR, out_of_sample_pairs, out_of_sample_table
from harness.contract import runfiles
from harness.contract.units import GB
from harness.offload import out_of_sample, plan_cli
from harness.offload.plan import device_limit_bytes, plan_offload

DEVICE_GB = 12


def profile(fwd_bwd_peak_gb: float) -> dict:
    """One forward and one backward graph over four 1 GB states, with the step model's readings; the run's steady
    fwd+bwd peak (`fwd_bwd_peak_gb`) is what the calibration anchors to, so two runs' profiles differ by it."""
    gb = lambda value: int(value * GB)  # noqa: E731
    return {
        "graph_order": [[0, False], [0, True]],
        "graphs": [{"graph_id": 0, "bwd": False, "start_alloc_bytes": gb(1),
                    "nodes": [{"name": "f0", "peak_bytes": gb(2)}, {"name": "f1", "peak_bytes": gb(3)}]},
                   {"graph_id": 0, "bwd": True,
                    "nodes": [{"name": f"b{i}", "peak_bytes": gb(peak)} for i, peak in enumerate((4, 3.5, 2))]}],
        "tasks": [{"id": f"{i}:fp32", "bytes": gb(1)} for i in range(4)],
        "device_total_bytes": gb(DEVICE_GB), "measured_start_bytes": gb(1), "step_transient_bytes": gb(0.5),
        "measured_fwd_bwd_peak_bytes": gb(fwd_bwd_peak_gb), "allocator_overhead_bytes": gb(0.1),
    }


def planned_point(sweep: Path, job: int, budget_gb: float, measured_peak: int, own_profile: dict,
                  seq_len: int = 64) -> str:
    """A point of our pass that planned a budget as DeepSpeed sizes it, measured `measured_peak` and profiled
    `own_profile`."""
    run_dir = write_point(sweep, job, arm="offload", seq_len=seq_len, budget_gb=budget_gb,
                          peak_reserved=2 * measured_peak, device_memory_gb=DEVICE_GB,
                          phase_times=((1.0, 0.5, 0.4, 0.5),),
                          extra={"offload.reload": "asap", "offload.release": "recorded",
                                 "offload.budget_rule": "deepspeed", "offload.compose": "none"})
    (sweep / run_dir / runfiles.PROFILE).write_text(json.dumps(own_profile))
    (sweep / run_dir / runfiles.PLAN).write_text(json.dumps({"rule": "budget", "budget_bytes": int(budget_gb * GB)}))
    return run_dir


def planned_from(source_profile: dict, budget_gb: float) -> int:
    limit = device_limit_bytes(DEVICE_GB * GB, source_profile["allocator_overhead_bytes"])
    return plan_offload(source_profile, int(budget_gb * GB), limit, "deepspeed").predicted_peak_bytes


@pytest.fixture
def sweep(tmp_path) -> Path:
    """Two points of one shape at budgets 8 and 6 GB, whose runs calibrated differently, and one of another shape."""
    planned_point(tmp_path, 0, 8, int(7.4 * GB), profile(fwd_bwd_peak_gb=3.5))
    planned_point(tmp_path, 1, 6, int(6.1 * GB), profile(fwd_bwd_peak_gb=3.2))
    planned_point(tmp_path, 2, 6, int(6.0 * GB), profile(fwd_bwd_peak_gb=3.2), seq_len=128)
    return tmp_path


def test_each_profile_predicts_the_other_points_of_its_shape_and_the_error_is_theirs(sweep):
    found = {(pair.profile_from[0], pair.point[0]): pair for pair in out_of_sample.pairs(sweep)}
    assert set(found) == {("0", "1"), ("1", "0")}  # the seq 128 point has no other point of its shape
    pair = found[("0", "1")]
    # planned as point 1 ran (budget 6 GB, DeepSpeed's sizing) on point 0's profile, not on its own
    assert pair.predicted_peak_bytes == planned_from(profile(3.5), 6) != planned_from(profile(3.2), 6)
    assert (pair.rule, pair.budget_bytes, pair.measured_peak_bytes) == ("budget", 6 * GB, int(6.1 * GB))
    assert pair.error == pytest.approx((pair.predicted_peak_bytes - 6.1 * GB) / (6.1 * GB))
    assert abs(pair.error) > 0.01


@pytest.mark.parametrize("key, other", [("train.reduce_bucket_size", 100_000_000), ("train.sub_group_size", 25_000_000),
                                        ("env.pytorch_cuda_alloc_conf", "expandable_segments:False")])
def test_points_that_differ_in_what_the_profile_holds_are_not_paired(sweep, key, other):
    """A point with other reduce buckets, sub-groups or allocator settings profiles other memory: not its shape."""
    config_path = next(sweep.glob("1_*")) / runfiles.CONFIG
    config = yaml.safe_load(config_path.read_text())
    group, name = key.split(".")
    config.setdefault(group, {})[name] = other
    config_path.write_text(yaml.safe_dump(config))
    assert [(pair.profile_from[0], pair.point[0]) for pair in out_of_sample.pairs(sweep)] == []


def test_a_key_our_arm_does_not_read_keeps_two_points_one_shape(sweep):
    """arm.schedule, written by an experiment for every arm, is no knob of ours: the points still predict each other."""
    config_path = next(sweep.glob("1_*")) / runfiles.CONFIG
    config = yaml.safe_load(config_path.read_text())
    config["arm"]["schedule"] = "z3_only"
    config_path.write_text(yaml.safe_dump(config))
    assert {(pair.profile_from[0], pair.point[0]) for pair in out_of_sample.pairs(sweep)} == {("0", "1"), ("1", "0")}


def test_the_command_prints_the_pairs_and_refuses_flags_that_would_plan_otherwise(sweep, capsys):
    assert plan_cli.main(["--out-of-sample", str(sweep)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert {(pair["profile_from"][0], pair["point"][0]) for pair in printed} == {("0", "1"), ("1", "0")}
    assert all(pair["error"] != 0 for pair in printed)
    with pytest.raises(SystemExit) as refused:
        plan_cli.main(["--out-of-sample", str(sweep), "--budget-gb", "3"])
    assert refused.value.code == 2 and "drop --budget-gb" in capsys.readouterr().err


def test_the_table_shows_each_pairs_error_and_says_where_a_point_has_none(sweep):
    table = out_of_sample_table(load_sweep(sweep).points, [json.loads(out_of_sample.pairs_json([pair]))[0]
                                                           for pair in out_of_sample.pairs(sweep)])
    rows = {row[("", "profile from")][0]: row for row in table.display.to_dict("records")}
    assert rows["2"][("", "point predicted")] == NO_PAIR
    error = rows["0"][("", "error")]
    assert error.startswith("+") and error != "+0.00%"
    assert rows["0"][("", "plan")] == "budget, 6.00 GB" and rows["0"][("", "measured peak (GB)")] == "6.10"


@pytest.mark.slow
def test_the_report_reads_the_pairs_through_the_command(sweep):
    pairs, warnings = out_of_sample_pairs(sweep)
    assert [(pair["profile_from"], pair["point"]) for pair in pairs] == \
        [(pair.profile_from, pair.point) for pair in out_of_sample.pairs(sweep)]
    assert warnings == []


def test_a_profile_from_before_the_step_model_plans_nothing_and_says_so(sweep):
    old = {key: value for key, value in profile(3.5).items() if key != "measured_start_bytes"}
    (sweep / next(sweep.glob("0_*")).name / runfiles.PROFILE).write_text(json.dumps(old))
    warnings: list[str] = []
    found = out_of_sample.pairs(sweep, warn=warnings.append)
    assert [(pair.profile_from[0], pair.point[0]) for pair in found] == [("1", "0")]
    assert len(warnings) == 1 and "measured_start_bytes" in warnings[0] and "predicts no peak" in warnings[0]
