"""The benchmark printer: knob labels, reserved trajectories, loss differences and comparisons with their intervals
from run files."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from analysis.fixtures.synthetic import write_point as write_synthetic
from analysis.bench import comparisons, knob_defaults, load_points, report, run_lengths
from harness.contract.runfiles import OVERRIDES


def write_point(sweep: Path, name: str, arm: str, median: float, losses: list[float], budget_gb=1e-6,
                reserved_cap_gb=None, retries=0, **knobs):
    run_dir = sweep / name
    run_dir.mkdir(parents=True)
    offload = {**knob_defaults(), "budget_gb": budget_gb, **knobs}
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"arm": {"name": arm}, "model": {"name": "tiny"},
                                                         "offload": offload, "env": {"reserved_cap_gb": reserved_cap_gb}}))
    (run_dir / "summary.json").write_text(json.dumps({
        "status": "ok", "planned_offload_bytes": 640 if arm != "deepcompile" else None,
        "final": {"phase": 1, "step_time_s": {"median": median}, "alloc_retries": {"sum": retries}}}))
    rows = [{"step": i, "phase": 0 if i == 0 else 1, "phase_step": max(i - 1, 0), "step_time_s": median, "loss": loss,
             "peak_reserved_bytes": int((11 + i) * 1e9)} for i, loss in enumerate(losses)]
    (run_dir / "steps.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_report_prints_knobs_that_differ_and_loss_differences(tmp_path):
    write_point(tmp_path, "0_dc", "deepcompile", 0.05, [10.0, 9.0, 8.0], budget_gb=None)
    write_point(tmp_path, "1_ds", "ds_offload", 0.25, [10.0, 9.0, 8.0])
    write_point(tmp_path, "2_ours", "offload", 0.125, [10.0, 9.0, 8.0008], release="ordered", peak_cap_gb=12)
    text = report(load_points([tmp_path]))
    assert "== budget_gb=1e-06" in text
    # only knobs that differ from conf/offload/default.yaml label our pass
    assert "offload[release=ordered,peak_cap_gb=12]" in text and "final median 0.1250 s" in text
    assert "max rel loss diff vs deepcompile 1.00e-04" in text
    assert "final-phase peak reserved GB per step: [12.0, 13.0]" in text  # phase 1 only


def test_report_prints_bytes_as_gb_and_leaves_out_knobs_the_point_left_idle(tmp_path):
    write_point(tmp_path, "0_ours", "offload", 0.125, [10.0, 9.0], budget_gb=11, auto_rule="margin",
                budget_rule="deepspeed")
    write_point(tmp_path, "1_auto", "offload", 0.125, [10.0, 9.0], budget_gb=None, auto_rule="margin",
                budget_rule="step_model")
    text = report(load_points([tmp_path]))
    assert "planned offload 0.00 GB" in text and "planned offload 640 " not in text
    # auto_rule picks a plan only without a budget, budget_rule only with one: each point is labelled by the
    # knob that made its plan
    assert "offload[budget_rule=deepspeed] " in text and "offload[auto_rule=margin] " in text


def set_train(run_dir: Path, **train) -> None:
    """Sets `train` keys as a sweep does, by overrides (the design sees a key an override names)."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    (run_dir / "config.yaml").write_text(yaml.safe_dump({**config, "train": {"seq_len": 1024, **train}}))
    (run_dir / OVERRIDES).parent.mkdir()
    (run_dir / OVERRIDES).write_text(yaml.safe_dump([f"train.{key}={value}" for key, value in train.items()]))


def test_report_labels_each_point_by_the_settings_that_tell_its_arms_points_apart(tmp_path):
    """Two points of our pass that differ only in train.sub_group_size, and two of DeepSpeed's pass that differ
    only in their repeat, print four different labels; a setting every point of an arm shares is left out."""
    for name, arm, train in (("0_ours", "offload", {"sub_group_size": 100000000}),
                             ("1_ours", "offload", {"sub_group_size": 25000000}),
                             ("2_ds", "ds_offload", {"repeat": 0}), ("3_ds", "ds_offload", {"repeat": 1})):
        write_point(tmp_path, name, arm, 0.1, [10.0, 9.0])
        set_train(tmp_path / name, **train)
    labels = [line.split()[0] for line in report(load_points([tmp_path])).splitlines() if line.startswith("  ")
              and not line.lstrip().startswith("final-phase")]
    # named as the report names them (analysis.design): train.repeat is the `repeat` column
    assert labels == ["offload[train.sub_group_size=100000000]", "offload[train.sub_group_size=25000000]",
                      "ds_offload[repeat=0]", "ds_offload[repeat=1]"]


def repeats(sweep: Path, arm: str, seconds: float, runs: int = 2, **kwargs) -> None:
    """`runs` repeats of one point whose measured steps take about `seconds` (a compile step of 5 s first)."""
    for repeat in range(runs):
        jitter = (0.99, 1.01, 1.0, 0.98, 1.02)
        write_synthetic(sweep, len(list(sweep.glob("*_*"))), arm=arm, repeat=repeat,
                        phase_times=((5.0, *(seconds * j for j in jitter)),), **kwargs)


def test_comparisons_give_each_ratio_its_interval_over_repeats(tmp_path):
    repeats(tmp_path, "ds_offload", 0.20, budget_gb=11.0)
    repeats(tmp_path, "offload", 0.10, budget_gb=11.0)
    repeats(tmp_path, "offload", 0.30, budget_gb=13.0)  # no DeepSpeed point at 13 GB: nothing to compare
    text = comparisons([tmp_path])
    lines = [line for line in text.splitlines() if " / " in line]
    assert len(lines) == 1 and lines[0].startswith("  offload, budget_gb=11 / ds_offload: 0.500× [")
    assert lines[0].endswith("n = 2×5 / 2×5: faster")


def test_comparisons_pair_points_under_the_same_allocator_ceiling(tmp_path):
    repeats(tmp_path, "ds_offload", 0.25, budget_gb=11.0)
    repeats(tmp_path, "ds_offload", 0.30, budget_gb=11.0, extra={"env.reserved_cap_gb": 12})
    repeats(tmp_path, "offload", 0.15, budget_gb=11.0, extra={"env.reserved_cap_gb": 12})
    lines = [line for line in comparisons([tmp_path]).splitlines() if " / " in line]
    assert len(lines) == 1 and "offload / ds_offload, env.reserved_cap_gb=12: 0.500×" in lines[0]  # not the 0.25 s


def test_no_comparison_without_a_finished_base(tmp_path):
    repeats(tmp_path, "offload", 0.125, budget_gb=11.0)
    assert comparisons([tmp_path]) == ""


def test_reserved_trajectory_prints_repeats_once_with_their_count():
    assert run_lengths([11.2, 14.3, 14.3, 14.4, 14.3]) == "[11.2, 14.3×2, 14.4, 14.3]"
    assert run_lengths([]) == "[]"


def test_stall_and_prediction_error_are_reported_for_points_that_have_them():
    from analysis.bench import prediction_error, stall_and_prediction

    summary = {"predicted_peak_bytes": 11_000_000_000,
               "final": {"phase": 1, "offload_stall_s": {"median": 0.0125}}}
    rows = [{"phase": 0, "phase_step": 0, "peak_allocated_bytes": 30_000_000_000},
            {"phase": 1, "phase_step": 0, "peak_allocated_bytes": 20_000_000_000},  # the compile step: left out
            {"phase": 1, "phase_step": 1, "peak_allocated_bytes": 10_000_000_000},
            {"phase": 1, "phase_step": 2, "peak_allocated_bytes": 9_000_000_000}]
    point = {"summary": summary, "rows": rows}
    assert prediction_error(point) == 0.1
    assert stall_and_prediction(point) == " | copy stall 0.0125 s/step | predicted peak 11.00 GB (+10.0% of measured)"
    assert stall_and_prediction({"summary": {"final": {}}, "rows": []}) == ""
    assert prediction_error({"summary": {"predicted_peak_bytes": None, "final": None}, "rows": rows}) is None


def test_our_pass_composed_is_set_against_ours_alone_at_the_same_budget(tmp_path):
    repeats(tmp_path, "ds_offload", 0.20, budget_gb=11.0)
    repeats(tmp_path, "offload", 0.10, budget_gb=11.0, extra={"offload.compose": "none"})
    repeats(tmp_path, "offload", 0.08, budget_gb=11.0, extra={"offload.compose": "prefetch_selective_gather"})
    repeats(tmp_path, "offload", 0.09, budget_gb=13.0, extra={"offload.compose": "prefetch"})  # no alone at 13 GB
    lines = sorted(line.strip() for line in comparisons([tmp_path]).splitlines() if " / " in line)
    assert [line.partition("×")[0] for line in lines] == [
        "offload, budget_gb=11, compose=none / ds_offload: 0.500",
        "offload, budget_gb=11, compose=prefetch_selective_gather / ds_offload: 0.400",
        "offload, budget_gb=11, compose=prefetch_selective_gather / offload, budget_gb=11, compose=none: 0.800"]
