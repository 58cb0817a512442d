"""End-to-end CPU runs through the real driver -> torchrun -> worker path (tiny model, ZeRO-3, gloo)."""
import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml

from analysis.columns import is_design_column
from analysis.load import load_sweep
from analysis.tables import failed_statuses
from conftest import BAD_VALUES, TINY_RUN, driver_env, harness_cmd, harness_run, read_run
from harness import arms
from harness.contract import schema
from harness.contract.steps import quartiles, time_stats
from harness.contract.runfiles import read_jsonl
from harness.driver.sinks import flat_summary, mirror_to_wandb


def file_modes(run_dir: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in run_dir.iterdir() if p.is_file()}


@pytest.mark.slow
def test_tiny_zero3_run_medians_match_steps_and_wandb(tmp_path, run_file_mode):
    proc = harness_run(tmp_path, "logger=wandb", "arm.phase_starts=[0,2]", "train.measure_steps=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "run"
    rows, summary = read_run(run_dir)
    assert summary["status"] == "ok" and len(rows) == 4
    assert [r["phase"] for r in rows] == [0, 0, 1, 1] and [r["phase_step"] for r in rows] == [0, 1, 0, 1]
    for phase in summary["phases"]:
        measured = [r for r in rows if r["phase"] == phase["phase"] and r["phase_step"] > 0]
        assert phase["n"] == len(measured) == 1
        assert phase["step_time_s"] == time_stats([r["step_time_s"] for r in measured])
        first = next(r for r in rows if r["phase"] == phase["phase"] and r["phase_step"] == 0)
        assert phase["compile_time_s"] == first["step_time_s"]
    assert summary["final"] == summary["phases"][-1]
    for row in rows:
        assert row["tokens"] == 2 * 32 and row["tokens_per_s"] == pytest.approx(64 / row["step_time_s"])
        assert row["peak_reserved_bytes"] is None  # no device memory on CPU
        assert row["host_rss_bytes"] > 100e6  # a rank holding torch and DeepSpeed resides in well over 100 MB
        assert row["pinned_host_bytes"] is None and row["pin_time_s"] is None  # no pinned allocator on CPU
        assert row["gc_s"] >= 0 and row["gc_collections"] >= 0  # train.gc=auto: whatever landed in the step
        assert row["end_sync_s"] is None  # no device to wait for
    worker = json.loads((run_dir / "worker.json").read_text())
    assert 1 < worker["startup_s"] < summary["wall_time_s"]  # importing torch alone takes over a second
    split = summary["wall_split"]  # the eager arm's: start-up in parts, each phase's first step, no DeepCompile
    assert split == worker["wall_split"] and summary["profile_cache"] is None  # a single run reuses nothing
    assert [step["phase"] for step in split["first_steps"]] == [0, 1]
    assert all(step["dc_profiling_s"] is None and step["dc_passes_s"] is None for step in split["first_steps"])
    assert all(split[name] > 0 for name in ("imports_s", "process_group_s", "model_s", "engine_s"))
    assert split["process_s"] < summary["wall_time_s"]
    env = json.loads((run_dir / "env.json").read_text())
    assert env["world_size"] == 1 and env["pytorch_cuda_alloc_conf"] == "expandable_segments:True"
    assert "git_sha" in env and env["torch"]
    assert {"git_dirty_files", "git_diff_sha256"} <= set(env)  # what made the tree dirty, if it was
    assert (run_dir / "git.diff").is_file() == bool(env["git_dirty"])
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb")), "the driver's offline W&B run file"
    modes = file_modes(run_dir)
    assert {"config.yaml", "summary.json", "env.json", "worker.json", "steps.jsonl", "worker.log"} <= set(modes)
    assert set(modes.values()) == {run_file_mode}, modes
    # The W&B mirror, re-run in-process on the same files, is given the same final medians.
    written = yaml.safe_load((run_dir / "config.yaml").read_text())
    written = {**written, "logger": {"name": "wandb", "mode": "offline", "project": "t"},
               "sweep": {**written["sweep"], "name": "test"}}
    (tmp_path / "again").mkdir()
    logged = mirror_to_wandb(tmp_path / "again", schema.typed(written, arms.from_config(written["arm"])), rows,
                             summary, env)
    assert logged["final/step_time_s/median"] == quartiles([rows[3]["step_time_s"]])["median"]
    assert logged["final/n"] == 1 and logged["status"] == "ok"
    assert flat_summary(summary)["phase0/step_time_s/median"] == rows[1]["step_time_s"]


@pytest.mark.slow
def test_with_gc_between_steps_no_collection_lands_inside_a_step(tmp_path):
    """train.gc=between_steps: automatic collection is off and the full collections run between steps, so every
    step, the compile steps too, records none inside its time."""
    proc = harness_run(tmp_path, "logger=none", "train.gc=between_steps", "train.measure_steps=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows, summary = read_run(tmp_path / "run")
    assert summary["status"] == "ok" and rows
    assert all(row["gc_collections"] == 0 and row["gc_s"] == 0 for row in rows), rows
    assert summary["final"]["gc_collections"] == {"measured_sum": 0}


@pytest.mark.slow
def test_multirun_records_a_killed_point_and_goes_on(tmp_path):
    proc = harness_run(tmp_path, "logger=none", "debug.fault=null,kill", "debug.fault_step=1", multirun=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    index = read_jsonl(tmp_path / "sweep" / "index.jsonl")
    assert [line["status"] for line in index] == ["ok", "died"]
    assert "debug.fault=null" in index[0]["overrides"] and "debug.fault=kill" in index[1]["overrides"]
    died_rows, died = read_run(tmp_path / "sweep" / index[1]["run_dir"])
    assert died["status"] == "died" and died["steps_completed"] == 1 == len(died_rows)
    assert "SIGKILL" in died["reason"] or "-9" in died["reason"]


# one bad value of each kind, each beside a good one: the sweep crosses them, so one point has none
BAD_OR_GOOD = {"launcher.timeout_s": ("abc", "600"),                # type
               "offload.budget_gb": ("nan", "null"),                # finiteness
               "train.lr": ("-1", "0.001"),                         # range
               "model.config.num_attention_heads": ("7", "4"),      # shape (kv heads 2 do not split 7)
               "train.seed": ("${oc.env:HARNESS_TEST_UNSET}", "7")}  # an interpolation that cannot resolve


@pytest.mark.slow
def test_a_sweep_of_bad_values_records_every_point_and_writes_its_index(tmp_path):
    sweep = [f"{key}={bad},{good}" for key, (bad, good) in BAD_OR_GOOD.items()]
    proc = harness_run(tmp_path, "logger=none", *sweep, multirun=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    index = read_jsonl(tmp_path / "sweep" / "index.jsonl")
    assert len(index) == 2 ** len(BAD_OR_GOOD) == len(list((tmp_path / "sweep").glob("*/summary.json")))
    for line in index:
        bad = [key for key, (_, good) in BAD_OR_GOOD.items() if f"{key}={good}" not in line["overrides"]]
        if not bad:
            assert line["status"] == "ok"
        elif "train.seed" in bad:  # resolving the config fails before any check, naming the key
            assert line["status"] == "config_error" and line["reason"].startswith("train.seed: ")
            assert "HARNESS_TEST_UNSET" in line["reason"]
        else:
            assert line["status"] == "config_error" and line["reason"].split(":")[0] in bad + [
                "model.config.num_key_value_heads"]
        if len(bad) == 1:
            named = line["reason"].split(":")[0]
            assert named == bad[0] or (bad[0], named) == ("model.config.num_attention_heads",
                                                         "model.config.num_key_value_heads")
    assert "Traceback" not in proc.stderr  # every refusal is one line


@pytest.mark.slow
def test_oom_and_timeout_are_recorded_with_their_status(tmp_path):
    # The hang is caught by the stall timeout, whose clock starts at the first step: however slow start-up is
    # on a loaded machine, both steps before the fault are written first (the whole-point timeout_s would
    # have to guess how long start-up takes).
    proc = harness_run(tmp_path, "logger=none", "debug.fault=oom,hang", "debug.fault_step=2",
                       "launcher.stall_timeout_s=20", multirun=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    index = read_jsonl(tmp_path / "sweep" / "index.jsonl")
    assert [line["status"] for line in index] == ["oom", "timeout"]
    assert index[1]["reason"].startswith("no new step for ") and index[1]["reason"].endswith(
        " s after step 1 (2 of 4 steps)")
    for line in index:
        rows, summary = read_run(tmp_path / "sweep" / line["run_dir"])
        assert summary["steps_completed"] == 2 == len(rows)  # the steps before the failure are kept
    assert not is_design_column("launcher.stall_timeout_s")  # the analysis does not tell points apart by it


def wait_for_steps(driver: subprocess.Popen, folder: Path, pattern: str, count: int) -> Path:
    """The steps.jsonl (folder/pattern) that the running driver's point fills, once it holds `count` steps."""
    while driver.poll() is None:
        for path in folder.glob(pattern):
            if len(read_jsonl(path)) >= count:
                return path
        time.sleep(0.5)
    raise AssertionError(f"the driver ended with code {driver.returncode} first")


def all_gone(processes: list[psutil.Process], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        alive = [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("hung", [False, True], ids=["training", "hung"])
def test_ctrl_c_stops_every_rank_records_the_point_interrupted_and_ends_the_sweep(tmp_path, hung):
    fault = ["debug.fault=hang", "debug.fault_step=2"] if hung else []
    cmd = harness_cmd(tmp_path, "logger=none", "train.measure_steps=100000", *fault, "train.repeat=0,1", multirun=True)
    with open(tmp_path / "driver.out", "w") as out:  # a file, not a pipe nobody reads while the point runs
        driver = subprocess.Popen(cmd, cwd=tmp_path, env=driver_env(), stdout=out, stderr=subprocess.STDOUT)
    steps = wait_for_steps(driver, tmp_path, "sweep/0_*/steps.jsonl", 2)
    ranks = psutil.Process(driver.pid).children(recursive=True)  # torchrun and the rank
    assert len(ranks) >= 2
    driver.send_signal(signal.SIGINT)  # what Ctrl-C sends it
    assert all_gone(ranks, within_s=10)
    driver.wait(timeout=300)
    output = (tmp_path / "driver.out").read_text()
    assert driver.returncode == 130, output[-3000:]
    assert "interrupted: the point's run files are in " in output
    index = read_jsonl(tmp_path / "sweep" / "index.jsonl")
    assert [line["status"] for line in index] == ["interrupted"]  # the sweep stopped: point 1 never ran
    sweep = load_sweep(tmp_path / "sweep")  # the analysis reads the status, the report prints it
    assert list(sweep.points["status"]) == ["interrupted"] and not sweep.problems
    assert failed_statuses(sweep.points["status"]) == "INTERRUPTED"
    rows, summary = read_run(steps.parent)
    assert summary["status"] == "interrupted" and summary["reason"].startswith("SIGINT after ")
    assert summary["steps_completed"] == len(rows) >= 2  # the steps done are kept
    if hung:
        assert len(rows) == 2


@pytest.mark.slow
def test_sigterm_outside_slurm_records_the_point_ends_the_sweep_and_exits_143(tmp_path):
    cmd = harness_cmd(tmp_path, "logger=none", "train.measure_steps=100000", "train.repeat=0,1", multirun=True)
    with open(tmp_path / "driver.out", "w") as out:
        driver = subprocess.Popen(cmd, cwd=tmp_path, env=driver_env(), stdout=out, stderr=subprocess.STDOUT)
    steps = wait_for_steps(driver, tmp_path, "sweep/0_*/steps.jsonl", 2)
    processes = psutil.Process(driver.pid).children(recursive=True)  # torchrun and the rank
    assert len(processes) >= 2
    driver.send_signal(signal.SIGTERM)  # what kill, timeout, docker stop and a CI runner's cancel send
    driver.wait(timeout=300)
    output = (tmp_path / "driver.out").read_text()
    assert driver.returncode == 143, output[-3000:]
    assert all_gone(processes, within_s=10)
    index = read_jsonl(tmp_path / "sweep" / "index.jsonl")
    assert [line["status"] for line in index] == ["preempted"] and index[0]["reason"].startswith("SIGTERM after ")
    assert not list((tmp_path / "sweep").glob("1_*"))  # the second point never started
    rows, summary = read_run(steps.parent)
    assert summary["steps_completed"] == len(rows) >= 2


@pytest.mark.slow
def test_a_failed_single_point_exits_1_so_a_script_can_tell(tmp_path):
    proc = harness_run(tmp_path, "logger=none", "debug.fault=kill", "debug.fault_step=1")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert read_run(tmp_path / "run")[1]["status"] == "died"


# 30 overrides at values that run quickly (with TINY_RUN's three); Hydra names a point's folder from all of them
LONG_POINT = [
    "model.config.hidden_size=64", "model.config.intermediate_size=128", "model.config.num_hidden_layers=2",
    "model.config.num_attention_heads=4", "model.config.num_key_value_heads=2", "model.config.head_dim=16",
    "model.config.vocab_size=512", "model.config.max_position_embeddings=1024", "model.config.tie_word_embeddings=false",
    "train.micro_batch=1", "train.grad_accum=1", "train.dtype=bf16", "train.seed=7", "train.repeat=0",
    "train.sub_group_size=null", "train.reduce_bucket_size=null", "train.torch_adam=null",
    "offload.budget_gb=0.000001", "offload.margin=0.25", "offload.mode=async", "offload.empty_cache=never",
    "offload.streams=single", "offload.reload=at_end", "offload.release=recorded", "offload.peak_cap_gb=null",
    "debug.fault_sleep_s=0.5", "debug.fault_rank=0",
]


@pytest.mark.slow
def test_a_sweep_point_with_30_overrides_gets_a_folder_name_that_fits(tmp_path):
    # the two points differ in train.lr only; the second is refused, so only the first launches
    proc = harness_run(tmp_path, "logger=none", *LONG_POINT, "train.lr=0.001,-1", multirun=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    index = read_jsonl(tmp_path / "sweep" / "index.jsonl")
    assert [line["status"] for line in index] == ["ok", "config_error"]
    assert index[0]["run_dir"] != index[1]["run_dir"]
    for line, lr in zip(index, (0.001, -1)):
        assert len(line["run_dir"].encode()) < 255 and line["run_dir"].split("_", 1)[0].isdigit()
        keys = {override.split("=")[0] for override in line["overrides"]}  # the sweep respells values (1e-06)
        assert {override.split("=")[0] for override in LONG_POINT + TINY_RUN} <= keys and len(keys) >= 30
        config = yaml.safe_load((tmp_path / "sweep" / line["run_dir"] / "config.yaml").read_text())
        assert config["train"]["lr"] == lr and config["offload"]["margin"] == 0.25


@pytest.mark.slow
def test_two_rank_gloo_run(tmp_path, run_file_mode):
    # rank 0 profiles step 2; the memory trace and the reserved cap need CUDA: on CPU each is skipped with a line,
    # and the run goes on. The cap is set when the last phase the run reaches begins, also when a later phase
    # start lies past the run's end.
    proc = harness_run(tmp_path, "logger=none", "launcher.nproc_per_node=2", "debug.profile_step=2",
                       "debug.memory_trace_step=1", "env.reserved_cap_gb=1", "arm.phase_starts=[0,2,50]",
                       "train.steps=4", "train.measure_steps=null")  # a total that ends before the last phase
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows, summary = read_run(tmp_path / "run")
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert summary["status"] == "ok" and summary["world_size"] == 2 and env["world_size"] == 2
    assert all(r["tokens"] == 2 * 2 * 32 for r in rows)
    assert [r["traced"] for r in rows] == [False, False, True, False]  # only the profiled step (no CUDA trace)
    log = (tmp_path / "run" / "worker.log").read_text()
    assert "debug.memory_trace_step needs CUDA" in log and "env.reserved_cap_gb needs CUDA" in log
    assert env["reserved_cap_gb"] == 1
    assert not (tmp_path / "run" / "memory_trace.json").exists()
    trace = json.loads((tmp_path / "run" / "torch_trace.json").read_text())
    names = {event.get("name", "") for event in trace["traceEvents"]}
    assert any(name.startswith("aten::") for name in names)  # the step's operators were recorded
    ops_text = (tmp_path / "run" / "torch_ops.txt").read_text()
    assert "operators by self_cpu_time_total" in ops_text and "Self CPU" in ops_text
    assert "self_device_time_total" not in ops_text  # no device table without CUDA
    assert set(file_modes(tmp_path / "run").values()) == {run_file_mode}  # the profiler's trace too


@pytest.mark.gpu
def test_profile_of_one_step_and_memory_trace_of_two_on_cuda(tmp_path):
    # torch Adam: no DeepSpeed op build, so the run takes about a minute
    proc = harness_run(tmp_path, "logger=none", "train.torch_adam=true", "debug.profile_step=1",
                       "debug.memory_trace_step=2", "debug.memory_trace_steps=2")
    run = tmp_path / "run"
    rows, summary = read_run(run)
    assert summary["status"] == "ok", proc.stdout[-3000:] + proc.stderr[-3000:]

    trace = json.loads((run / "memory_trace.json").read_text())
    assert trace["steps"] == [2, 3]  # one recording over the window
    assert [row["step"] for row in rows if row["traced"]] == [1, 2, 3]  # the profiled step and the window
    assert trace["trace_entries"] > 0 and trace["streams"]
    assert trace["reserved_bytes"] >= trace["allocated_bytes"] > 0
    assert (run / "memory_snapshot.pickle").stat().st_size > 0

    events = json.loads((run / "torch_trace.json").read_text())["traceEvents"]
    assert any(event.get("cat") == "kernel" for event in events)  # device kernels were recorded
    ops_text = (run / "torch_ops.txt").read_text()
    assert "operators by self_cpu_time_total" in ops_text and "operators by self_device_time_total" in ops_text


@pytest.mark.gpu
def test_reserved_cap_bounds_reserved_memory_on_cuda(tmp_path):
    # same run twice, uncapped and capped between its allocated and its reserved peak (eager ZeRO-3 on the probe
    # model reserves ~1.3 GB above what it allocates; the tiny model reserves almost nothing extra)
    big = ["logger=none", "model=probe_534m", "train.torch_adam=true", "train.seq_len=1024", "train.micro_batch=4",
           "train.warmup_steps=0", "train.measure_steps=3"]
    for name in ("free", "capped"):
        (tmp_path / name).mkdir()
    harness_run(tmp_path / "free", *big)
    free_rows, free_summary = read_run(tmp_path / "free" / "run")
    assert free_summary["status"] == "ok"
    allocated = max(r["peak_allocated_bytes"] for r in free_rows)
    reserved = max(r["peak_reserved_bytes"] for r in free_rows)
    cap = max((allocated + reserved) / 2, allocated + 64 * 2**20)  # room for the allocator's page rounding
    if cap >= reserved:
        pytest.skip(f"the uncapped run reserves {reserved / 2**20:.0f} MiB for {allocated / 2**20:.0f} MiB "
                    "allocated; no cap between them to test")

    proc = harness_run(tmp_path / "capped", *big, f"env.reserved_cap_gb={cap / 1e9}")
    rows, summary = read_run(tmp_path / "capped" / "run")
    assert summary["status"] == "ok", proc.stdout[-3000:] + proc.stderr[-3000:]
    assert all(r["peak_reserved_bytes"] <= cap for r in rows)
    # the cap changes where blocks land, not the math; ZeRO-3's GPU reductions are not bitwise repeatable
    assert [r["loss"] for r in rows] == pytest.approx([r["loss"] for r in free_rows], rel=1e-4)


@pytest.mark.slow
def test_cuda_arm_on_cpu_is_skipped_not_crashed(tmp_path):
    proc = harness_run(tmp_path, "logger=none", "arm=deepcompile")
    assert proc.returncode == 1, proc.stderr[-3000:]  # a single point exits 0 only when ok
    assert "Traceback" not in proc.stderr
    _, summary = read_run(tmp_path / "run")
    assert summary["status"] == "skipped" and "CUDA" in summary["reason"]


THROWAWAY_ARM = '''
from dataclasses import dataclass

from harness.arms import EagerArm


@dataclass(frozen=True)
class Halves(EagerArm):
    """Eager ZeRO-3 whose second phase starts at step 2, whatever phase_starts says."""

    def phase_start_steps(self, cfg):
        return [0, 2]
'''


@pytest.mark.slow
def test_a_new_arm_is_one_class_and_one_yaml(tmp_path):
    """The class in a module of its own (here outside the repo, on PYTHONPATH), its YAML in a config dir of its
    own (given with Hydra's --config-dir): the driver, the validation and the worker pick it up, nothing else edited."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "throwaway_arm.py").write_text(THROWAWAY_ARM)
    (tmp_path / "conf" / "arm").mkdir(parents=True)
    (tmp_path / "conf" / "arm" / "halves.yaml").write_text(
        "_target_: throwaway_arm.Halves\nname: halves\nphase_starts: [0]\noffload_optimizer: null\n")
    path = os.pathsep.join([str(tmp_path / "code"), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = harness_run(tmp_path, "logger=none", "arm=halves", config_dir=tmp_path / "conf",
                       env={**driver_env(), "PYTHONPATH": path})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows, summary = read_run(tmp_path / "run")
    assert summary["status"] == "ok" and summary["arm"] == "halves"
    assert [phase["first_step"] for phase in summary["phases"]] == [0, 2]  # the class's phases
    assert [row["phase"] for row in rows] == [0, 0, 1, 1, 1, 1]  # and 3 measured steps after the final one's first
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["arm"]["name"] == "halves"


@pytest.mark.parametrize("overrides,key", [
    (["arm=nonexistent"], "arm"),
    (["model=nonexistent"], "model"),
    *BAD_VALUES,
])
@pytest.mark.slow
def test_bad_input_exits_nonzero_with_one_line_and_records_nothing_ok(tmp_path, overrides, key):
    proc = harness_run(tmp_path, "logger=none", *overrides)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and key in lines[0], proc.stderr
    summary_path = tmp_path / "run" / "summary.json"
    if summary_path.exists():
        assert json.loads(summary_path.read_text())["status"] == "config_error"
    assert not (tmp_path / "run" / "steps.jsonl").exists()


@pytest.mark.slow
def test_a_rerun_into_the_same_folder_keeps_the_earlier_attempt_whole(tmp_path):
    first = harness_run(tmp_path, "logger=none", "train.steps=0")
    second = harness_run(tmp_path, "logger=none", "train.micro_batch=0")
    assert first.returncode == second.returncode == 2
    lines = [ln for ln in second.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "train.micro_batch" in lines[0]  # still the one config error line on stderr
    run_dir, attempt = tmp_path / "run", tmp_path / "run" / "attempts" / "0"
    assert f"{run_dir} held an earlier attempt: its files are now in {attempt}" in second.stdout
    assert "train.steps=0" in (attempt / ".hydra" / "overrides.yaml").read_text()
    assert yaml.safe_load((attempt / "config.yaml").read_text())["train"]["steps"] == 0
    assert json.loads((attempt / "summary.json").read_text())["reason"].startswith("train.steps: ")
    assert "train.micro_batch=0" in (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["micro_batch"] == 0
    assert json.loads((run_dir / "summary.json").read_text())["reason"].startswith("train.micro_batch: ")
