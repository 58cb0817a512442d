"""Nothing to move costs nothing? The profiled step's trace read as data (harness/contract/profiled_step.py), the
compile counters and the trace through the reader into each point's row, the nothing_to_move table's ratios per
device size, and the campaign's points (experiments/nothing_to_move.yaml)."""
import json
import shutil

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from analysis.columns import PROFILED_COLUMNS
from analysis.load import load_sweep
from analysis.nothing_to_move import has_nothing_to_move, nothing_to_move_table
from conftest import REPO_ROOT
from harness.contract import protocol
from harness.contract.profiled_step import NotAProfiledStep, profiled_step
from harness.driver.validate import validate

CAPACITY = REPO_ROOT / "results" / "capacity" / "sweep"
OURS_1024, DEEPCOMPILE_1024 = "0_arm=offload,train.seq_len=1024", "12_arm=deepcompile,train.seq_len=1024"


def event(name: str, start: float, duration: float, category: str = "cpu_op", thread: int = 1) -> dict:
    return {"ph": "X", "name": name, "cat": category, "ts": start, "dur": duration, "pid": 1, "tid": thread}


def trace(sync_us: float = 100.0) -> dict:
    """A step of 10 ms: a compiled region with an ATen call inside (not eager), an eager ATen call with a nested
    one (counted once), one of our ops, a sync nested in another sync's time (counted once), an allocator call,
    and kernels on two streams that overlap (the device busy for their union)."""
    return {"traceEvents": [
        event("Torch-Compiled Region: 0/0", 0, 4000), event("aten::mm", 100, 500),
        event("aten::add_", 5000, 300), event("aten::copy_", 5050, 100),
        event("offload_harness::launch_offloads", 6000, 200),
        event("cudaStreamSynchronize", 7000, sync_us, "cuda_runtime"),
        event("cudaEventSynchronize", 7010, 20, "cuda_runtime"),
        event("cuMemMap", 8000, 50, "cuda_driver"), event("cudaLaunchKernel", 8100, 5, "cuda_runtime"),
        event("gemm", 1000, 2000, "kernel", thread=7), event("copy", 2500, 1500, "gpu_memcpy", thread=8),
        event("late kernel", 9000, 1000, "kernel", thread=7),
        {"ph": "i", "name": "an instant, not a complete event", "ts": 3},
    ]}


def test_the_profiled_step_counts_each_kind_of_host_time_once_and_the_device_by_its_union():
    step = profiled_step(trace())
    assert step.span_s == pytest.approx(10e-3)
    assert step.device_busy_s == pytest.approx(4e-3)  # 1000-4000 across both streams, then 9000-10000
    assert (step.sync_s, step.syncs) == (pytest.approx(100e-6), 2)
    assert (step.allocator_s, step.allocator_calls) == (pytest.approx(50e-6), 1)
    assert (step.our_ops_s, step.our_ops) == (pytest.approx(200e-6), 1)
    assert (step.eager_ops_s, step.eager_ops) == (pytest.approx(300e-6), 1)  # not the mm inside compiled code


@pytest.mark.parametrize("bad", [[], {"events": []}, {"traceEvents": []},
                                 {"traceEvents": [event("aten::mm", "0", 1)]},
                                 {"traceEvents": [event("aten::mm", 0, -1)]}],
                         ids=["list", "no-trace-events", "no-complete-event", "text-timestamp", "negative-duration"])
def test_a_file_that_is_no_chrome_trace_is_refused(bad):
    with pytest.raises(NotAProfiledStep):
        profiled_step(bad)


def copy_point(sweep_dir, name: str, source: str, device_gb, slower: float, sync_us: float | None,
               later_frames: int = 0):
    """A capacity point at seq 1024 as a point of the 2x2 design: its device size, its step times scaled, a profiled
    step (None: none) and the compile counters a run now records."""
    run_dir = sweep_dir / name
    shutil.copytree(CAPACITY / source, run_dir)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["env"]["device_memory_gb"] = device_gb
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    rows = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    (run_dir / "steps.jsonl").write_text("".join(json.dumps({**row, "step_time_s": row["step_time_s"] * slower})
                                                 + "\n" for row in rows))
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["wall_split"] = {"first_steps": [{"graphs": 4, "frames": 5, "graph_breaks": 1}],
                             "later_compiles": {"graphs": later_frames, "frames": later_frames, "graph_breaks": 0},
                             "compile_totals": {"graphs": 4 + later_frames, "frames": 5 + later_frames,
                                                "graph_breaks": 1}}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    if sync_us is not None:
        (run_dir / "torch_trace.json").write_text(json.dumps(trace(sync_us)))
    return run_dir


@pytest.fixture
def two_by_two(tmp_path):
    """Ours 1.3x slower than DeepCompile on the emulated 16 GB only, with longer syncs there, and one recompile."""
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    copy_point(sweep_dir, "0_ours_16", OURS_1024, 16, slower=1.0, sync_us=900.0, later_frames=1)
    copy_point(sweep_dir, "1_ours_real", OURS_1024, None, slower=0.78, sync_us=100.0)
    copy_point(sweep_dir, "2_dc_16", DEEPCOMPILE_1024, 16, slower=1.0, sync_us=100.0)
    copy_point(sweep_dir, "3_dc_real", DEEPCOMPILE_1024, None, slower=1.0, sync_us=None)
    return sweep_dir


def test_the_table_says_whether_the_cost_follows_the_emulated_device(two_by_two):
    sweep = load_sweep(two_by_two)
    assert not sweep.problems
    assert has_nothing_to_move(sweep.points)
    table = nothing_to_move_table(sweep.points, sweep.steps)
    values = table.values.set_index(["arm", table.values["device_memory_gb"].fillna(0)])
    emulated, real = values.loc[("offload", 16)], values.loc[("offload", 0)]
    assert emulated["ratio_low"] > 1.1 and emulated["ratio"] == pytest.approx(0.0784 / 0.0610, rel=0.02)
    assert real["ratio"] < emulated["ratio"] and real["ratio"] == pytest.approx(0.78 * 0.0784 / 0.0610, rel=0.02)
    assert pd_isna(values.loc[("deepcompile", 16), "ratio"])  # the reference carries no ratio
    assert emulated[PROFILED_COLUMNS["sync_s"]] == pytest.approx(900e-6)
    assert pd_isna(values.loc[("deepcompile", 0), PROFILED_COLUMNS["sync_s"]])  # no profiled step there
    assert (emulated["later_compiles"], real["later_compiles"]) == (1, 0)
    assert emulated["compiled_graphs"] == 5 and emulated["graph_breaks"] == 1
    assert emulated["empty_cache_calls"] == 0 and pd_isna(values.loc[("deepcompile", 16), "empty_cache_calls"])
    assert emulated["retries_per_step"] == 1 and values.loc[("deepcompile", 16), "retries_per_step"] >= 1
    display = table.display
    assert "real" in display[("", "device")].tolist() and "16 GB (emulated)" in display[("", "device")].tolist()
    assert "0.9 (2)" in display[("profiled step (ms)", "syncs")].tolist()


def pd_isna(value) -> bool:
    return value is None or value != value


def test_a_sweep_without_a_profiled_step_gets_no_table_and_the_committed_capacity_points_get_none():
    assert not has_nothing_to_move(load_sweep(CAPACITY).points)  # its report rebuilds byte for byte


def test_a_point_that_moved_something_is_not_compared(two_by_two):
    summary_file = two_by_two / "0_ours_16" / "summary.json"
    summary = json.loads(summary_file.read_text())
    (two_by_two / "0_ours_16" / "plan.json").unlink()
    summary["planned_offload_bytes"] = 10**9
    summary_file.write_text(json.dumps(summary))
    sweep = load_sweep(two_by_two)
    table = nothing_to_move_table(sweep.points, sweep.steps)
    assert list(table.values["arm"]).count("offload") == 1


def test_a_bad_trace_costs_its_columns_only_and_a_trace_outside_the_sweep_is_not_read(two_by_two, tmp_path):
    (two_by_two / "0_ours_16" / "torch_trace.json").write_text("{not json")
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps(trace()))
    (two_by_two / "1_ours_real" / "torch_trace.json").unlink()
    (two_by_two / "1_ours_real" / "torch_trace.json").symlink_to(outside)
    sweep = load_sweep(two_by_two)
    assert len(sweep.points) == 4
    lines = [problem.line() for problem in sweep.problems]
    assert len(lines) == 2 and all("profiled-step columns left empty" in line for line in lines)
    assert any("leads out of" in line for line in lines)
    profiled = sweep.points.set_index("run_dir")[PROFILED_COLUMNS["span_s"]]
    assert pd_isna(profiled["0_ours_16"]) and pd_isna(profiled["1_ours_real"])


def campaign_point(overrides: list[str]):
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiments=nothing_to_move", *overrides])
    return validate(OmegaConf.to_container(cfg, resolve=True), gpu_count=None)


@pytest.mark.parametrize("arm", ["offload", "deepcompile"])
@pytest.mark.parametrize("device", ["16", "null"])
def test_each_campaign_point_profiles_a_step_of_its_final_phase_and_still_measures_twenty(arm, device):
    config = campaign_point([f"arm={arm}", f"env.device_memory_gb={device}"])
    counts = protocol.step_counts(config.train, config.arm.phase_start_steps(config))
    profiled = config.debug.profile_step
    assert counts.first_measured <= profiled < counts.total
    assert counts.measured - 1 >= 20  # the profiled step is not a measured one
    assert config.offload.budget_gb is None and config.offload.budget_fraction is None  # ours: the device rule


@pytest.mark.slow
def test_the_report_writes_the_table_for_such_a_sweep(two_by_two, tmp_path):
    import contextlib
    import io

    from analysis.report import main as report_main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as stderr:
        status = report_main([str(two_by_two), "--out", str(tmp_path / "report")])
    assert status == 0, stderr.getvalue()
    table = (tmp_path / "report" / "tables" / "nothing_to_move.md").read_text()
    assert "1.285× [1.117, 1.362]" in table and "16 GB (emulated)" in table
