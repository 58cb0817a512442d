"""Loading run files (and W&B exports) into tidy points: columns, index handling, bad files."""
import json
import statistics
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml

from analysis.design import design
from analysis.fixtures.synthetic import write_point
from analysis.load import load_sweep, load_sweeps
from analysis.wandb_export import load_wandb, wandb_point
from harness.driver.sinks import flat_summary


def measured_median(times):
    """The final-phase median as the contract defines it: the compile step (first of the phase) left out."""
    return statistics.median(times[1:])


def test_point_row_has_config_status_phase_stats_and_env(tmp_path):
    phases = [(2.0, 0.9, 1.1, 1.0), (3.0, 0.5, 0.7, 0.4, 0.6)]
    write_point(tmp_path, 0, arm="offload", micro_batch=4, seq_len=128, budget_gb=12.0, phase_times=phases)
    sweep = load_sweep(tmp_path)
    assert sweep.problems == []
    point = sweep.points.iloc[0]
    assert (point["arm"], point["model"], point["micro_batch"], point["seq_len"]) == ("offload", "tiny", 4, 128)
    assert (point["budget_gb"], point["empty_cache"], point["streams"]) == (12.0, "never", 1)
    assert point["status"] == "ok" and point["n_phases"] == 2
    assert point["phase0_step_time_s_median"] == measured_median(phases[0])
    assert point["final_step_time_s_median"] == measured_median(phases[1])
    assert point["final_compile_time_s"] == 3.0
    assert point["budget_resolved_gb"] == 12.0
    assert point["env_torch"] == "2.11.0"
    assert len(sweep.steps) == 9 and set(sweep.steps["phase"]) == {0, 1}


def test_list_knobs_become_json_text_and_keys_the_arms_class_lacks_are_no_knobs(tmp_path):
    """Points group by a list knob as JSON text; a key older configs wrote under `arm` that the arm's class does not
    have (the synthetic `recompile_at`, our pass's old `schedule`) would label points by something that did not act."""
    write_point(tmp_path, 0, arm="zero3", extra={"arm.phase_starts": [0, 3]})
    write_point(tmp_path, 1, arm="offload", extra={"arm.schedule": "z3_only"})
    points = load_sweep(tmp_path).points
    assert points["arm_phase_starts"].iloc[0] == "[0, 3]" and points["arm_phase_starts"].isna().iloc[1]
    assert "arm_recompile_at" not in points and "arm_schedule" not in points and "arm.schedule" not in points


def test_index_repeats_and_unindexed_run_dirs_give_each_point_once(tmp_path):
    first = write_point(tmp_path, 0)
    write_point(tmp_path, 1, micro_batch=4, index=False)  # its driver never reached the index
    index = tmp_path / "index.jsonl"
    index.write_text(index.read_text() * 2)  # driver append + end-of-sweep rebuild
    points = load_sweep(tmp_path).points
    assert sorted(points["micro_batch"]) == [2, 4]
    assert points.loc[points["run_dir"] == first, "overrides"].item() == \
        "arm=zero3 train.micro_batch=2 train.repeat=0"


def test_points_follow_hydra_job_numbers_not_text_order(tmp_path):
    for job in (10, 2, 1):
        write_point(tmp_path, job, micro_batch=job)
    assert list(load_sweep(tmp_path).points["micro_batch"]) == [1, 2, 10]


def test_a_single_run_dir_loads_as_one_point(tmp_path):
    run_dir = tmp_path / write_point(tmp_path, 0, index=False)
    assert len(load_sweep(run_dir).points) == 1


def test_several_sweeps_keep_their_sweep_column(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        write_point(tmp_path / name, 0)
    sweep = load_sweeps([tmp_path / "a", tmp_path / "b"])
    assert list(sweep.points["sweep"]) == [str(tmp_path / "a"), str(tmp_path / "b")]
    assert set(sweep.steps["sweep"]) == {str(tmp_path / "a"), str(tmp_path / "b")}


def corrupt(path: Path, how: str) -> None:
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        path.write_text(path.read_text()[:25])
    elif how == "not a mapping":
        path.write_text("- just\n- a list\n")
    elif how == "no status":
        summary = json.loads(path.read_text())
        del summary["status"]
        path.write_text(json.dumps(summary))


@pytest.mark.parametrize("name, how, message", [
    ("summary.json", "delete", "missing"),
    ("summary.json", "truncate", "not valid JSON"),
    ("summary.json", "no status", "needs a status"),
    ("config.yaml", "delete", "missing"),
    ("config.yaml", "truncate", "not valid YAML"),
    ("config.yaml", "not a mapping", "not a resolved config"),
])
def test_a_bad_required_file_leaves_the_point_out_with_one_line_naming_it(tmp_path, name, how, message):
    write_point(tmp_path, 0)
    broken = write_point(tmp_path, 1, micro_batch=4)
    corrupt(tmp_path / broken / name, how)
    sweep = load_sweep(tmp_path)
    assert list(sweep.points["micro_batch"]) == [2]
    [line] = [problem.line() for problem in sweep.problems]
    assert line.startswith(f"warning: {tmp_path / broken / name}: {message}") and line.endswith("; point left out")
    assert sweep.left_out == [str(tmp_path / broken)]
    assert set(sweep.steps["run_dir"]) == {sweep.points["run_dir"].item()}


def test_bad_step_lines_are_skipped_with_one_line_for_the_file(tmp_path):
    run_dir = tmp_path / write_point(tmp_path, 0)
    steps_file = run_dir / "steps.jsonl"
    lines = steps_file.read_text().splitlines()
    lines[1] = "not json"
    steps_file.write_text("\n".join(lines) + "\n" + lines[-1][:30])  # a worker killed mid-write
    sweep = load_sweep(tmp_path)
    assert [problem.line() for problem in sweep.problems] == \
        [f"warning: {steps_file}: unreadable line(s) 2, 5 skipped"]
    assert len(sweep.points) == 1 and sweep.left_out == []
    assert list(sweep.steps["step"]) == [0, 2, 3]


def test_missing_env_keeps_the_point_without_env_columns(tmp_path):
    run_dir = tmp_path / write_point(tmp_path, 0)
    (run_dir / "env.json").unlink()
    sweep = load_sweep(tmp_path)
    assert len(sweep.points) == 1 and not any(c.startswith("env_") for c in sweep.points.columns)
    assert [problem.file for problem in sweep.problems] == [str(run_dir / "env.json")]


def test_unreadable_index_lines_are_named_and_the_run_dirs_still_load(tmp_path):
    write_point(tmp_path, 0)
    with open(tmp_path / "index.jsonl", "a") as index:
        index.write("{broken\n")
    sweep = load_sweep(tmp_path)
    assert len(sweep.points) == 1
    assert [problem.line() for problem in sweep.problems] == \
        [f"warning: {tmp_path / 'index.jsonl'}: unreadable line(s) 2"]


def test_overridden_keys_become_columns_for_every_point(tmp_path):
    write_point(tmp_path, 0)
    run_dir = write_point(tmp_path, 1)
    config_file = tmp_path / run_dir / "config.yaml"
    config = yaml.safe_load(config_file.read_text())
    config["debug"] = {"fault": "kill"}
    config_file.write_text(yaml.safe_dump(config))
    lines = [json.loads(line) for line in (tmp_path / "index.jsonl").read_text().splitlines()]
    lines[1]["overrides"] += ["debug.fault=kill", "+experiments/rows=ds_sync", "model=tiny"]
    (tmp_path / "index.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    points = load_sweep(tmp_path).points
    assert points["debug.fault"].isna().tolist() == [True, False]  # a leaf: its value in each point's config
    assert points["debug.fault"][1] == "kill"
    assert points["experiments/rows"].isna().tolist() == [True, False]  # a group choice: the override's value
    assert points["experiments/rows"][1] == "ds_sync"
    assert "model=tiny" not in points.columns and "model" in points.columns


def test_wandb_export_gives_the_columns_of_the_run_files(tmp_path):
    """The W&B mirror logs config.yaml as config and summary.json through harness.driver.sinks.flat_summary."""
    run_dir = tmp_path / write_point(tmp_path, 0, arm="offload", budget_gb=4.0,
                                     phase_times=[(2.0, 0.9, 1.1), (3.0, 0.5, 0.7, 0.4)], offload_bytes=10**9)
    from_files = load_sweep(tmp_path).points.iloc[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    env = json.loads((run_dir / "env.json").read_text())
    wandb_summary = {**flat_summary(summary), **{f"env/{k}": v for k, v in env.items() if not isinstance(v, list)},
                     "_runtime": 12.5, "step_time_s": 0.4}  # W&B's own keys and last history values
    row = wandb_point(yaml.safe_load((run_dir / "config.yaml").read_text()), wandb_summary, "me/proj/abc123")
    assert row["run_dir"] == "me/proj/abc123" and row["n_phases"] == 2
    compared = [c for c in from_files.index if c.startswith(("final_", "phase", "env_")) or c in
                ("arm", "model", "micro_batch", "seq_len", "budget_gb", "empty_cache", "status", "reason")]
    shared = [c for c in compared if c in row]
    assert {"final_step_time_s_median", "final_tokens_per_s_p75", "final_peak_reserved_bytes_max",
            "phase0_step_time_s_median", "phase1_offload_bytes_median", "status", "env_torch"} <= set(shared)
    assert {c: row[c] for c in shared} == {c: from_files[c] for c in shared}
    assert not any(key.startswith("_") or key == "step_time_s" for key in row)


def test_nested_wandb_summaries_flatten_to_the_same_columns():
    nested = {"status": "oom", "reason": "CUDA out of memory", "final": {"step_time_s": {"median": 1.5}},
              "phase0": {"step_time_s": {"median": 1.5}}}
    row = wandb_point({"arm": {"name": "zero3"}, "model": {"name": "tiny"}}, nested, "run")
    assert (row["status"], row["final_step_time_s_median"], row["phase0_step_time_s_median"]) == ("oom", 1.5, 1.5)


def test_load_wandb_asks_for_the_sweep_group():
    asked = []
    run = SimpleNamespace(config={"arm": {"name": "zero3"}, "model": {"name": "tiny"}},
                          summary_metrics={"status": "ok", "final/step_time_s/median": 0.2}, path=["me", "p", "id1"])

    class FakeApi:
        def runs(self, project, filters):
            asked.append((project, filters))
            return [run]

    sweep = load_wandb("me/p", "budget_sweep", api=FakeApi())
    assert asked == [("me/p", {"group": "budget_sweep"})]
    assert sweep.points[["arm", "status", "final_step_time_s_median", "run_dir"]].values.tolist() == \
        [["zero3", "ok", 0.2, "me/p/id1"]]


def test_emulated_device_size_and_oom_block_become_columns_and_old_run_dirs_read_as_null(tmp_path):
    oom = {"step": 3, "phase": 1, "stage": "step", "requested_bytes": 2 * 10**9, "free_bytes": 5 * 10**8,
           "limit_bytes": 24 * 10**9, "reserved_bytes": 23 * 10**9, "allocated_bytes": 22 * 10**9,
           "message": "CUDA out of memory"}
    write_point(tmp_path, 0, device_memory_gb=24.0, status="oom", oom=oom,
                phase_times=[(2.0, 0.5, 0.5), (3.0,)])
    write_point(tmp_path, 1, device_memory_gb=24.0, micro_batch=1)
    write_point(tmp_path, 2, micro_batch=4)  # an old run dir: no env.device_memory_gb, no oom block
    points = load_sweep(tmp_path).points.set_index("micro_batch")
    assert points.loc[2, ["device_memory_gb", "device_memory_bytes"]].tolist() == [24.0, 24 * 10**9]
    assert points.loc[2, [f"oom_{field}" for field in oom]].tolist() == list(oom.values())
    assert points.loc[1, "device_memory_gb"] == 24.0 and pd.isna(points.loc[1, "oom_phase"])
    assert points.loc[4, ["device_memory_gb", "device_memory_bytes", "oom_stage"]].isna().all()


def test_the_emulated_size_labels_points_and_the_oom_block_never_splits_them(tmp_path):
    write_point(tmp_path, 0, arm="zero3", device_memory_gb=24.0)
    write_point(tmp_path, 1, arm="zero3", device_memory_gb=24.0, repeat=1, status="oom",
                oom={"stage": "build", "phase": None, "step": None, "message": "out of memory"}, phase_times=[])
    write_point(tmp_path, 2, arm="zero3", device_memory_gb=40.0)
    points = load_sweep(tmp_path).points
    points_design = design(points)
    assert points_design.keys == ["arm", "device_memory_gb"]
    assert [points_design.label(row) for row in points.to_dict("records")] == \
        ["zero3, device_memory_gb=24"] * 2 + ["zero3, device_memory_gb=40"]


def test_runs_recorded_before_the_budget_rule_read_as_deepspeeds_sizing(tmp_path):
    # the key came after some committed runs; they sized their budget as DeepSpeed does, and must not merge as
    # repeats with a run that planned the same budget by the step model
    write_point(tmp_path, 0, arm="offload", budget_gb=11.0)
    write_point(tmp_path, 1, arm="offload", budget_gb=11.0, extra={"offload.budget_rule": "step_model"})
    points = load_sweep(tmp_path).points
    assert points["budget_rule"].tolist() == ["deepspeed", "step_model"]
    assert "budget_rule" in design(points).keys
