"""Start-up that cannot wait forever: a build lock left by a killed op build is cleared before a point's launch (a
later build no longer waits on it), the driver's own stop leaves none behind, and a point that writes no step within
launcher.startup_timeout_s ends as `timeout`, its reason the worker log's last line. The builds here are shell
stand-ins for torch's extension builder: it holds <op>/lock while ninja runs in the op's folder, and a build of
the same op waits until the lock is gone."""
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import harness_run
from harness.driver import buildlocks, launch
from harness.driver.progress import StartupWatch

# A build of `op` as torch runs it: wait while another build holds the lock, take it, build in the op's folder.
BUILD = ('cd "$TORCH_EXTENSIONS_DIR" && while [ -e op/lock ]; do sleep 0.1; done; mkdir -p op && touch op/lock '
         '&& cd op && echo building op && sleep "$BUILD_S" && rm lock && echo built op')


def extensions(tmp_path: Path, build_s: float) -> dict[str, str]:
    root = tmp_path / "torch_extensions"
    root.mkdir(exist_ok=True)
    return {**os.environ, "TORCH_EXTENSIONS_DIR": str(root), "BUILD_S": str(build_s)}


def run_build(tmp_path: Path, env: dict[str, str], timeout_s: float, **kwargs) -> launch.LaunchResult:
    return launch.run_workers(["sh", "-c", BUILD], env, tmp_path, timeout_s, echo=lambda line: None, **kwargs)


def test_a_lock_a_killed_build_left_is_removed_before_the_launch_and_the_build_runs(tmp_path, caplog):
    env = extensions(tmp_path, build_s=0)
    stale = Path(env["TORCH_EXTENSIONS_DIR"]) / "op" / "lock"
    stale.parent.mkdir()
    stale.touch()  # what a build killed mid-way leaves
    buildlocks.logger.addHandler(caplog.handler)  # whatever an earlier test made of the harness's loggers
    try:
        result = run_build(tmp_path, env, timeout_s=30)
    finally:
        buildlocks.logger.removeHandler(caplog.handler)
    assert not result.timed_out and result.returncode == 0  # before: it waited on the lock until timeout_s
    assert "built op" in (tmp_path / "worker.log").read_text()
    assert {record.getMessage() for record in caplog.records if "build lock" in record.getMessage()} == {
        f"warning: removed the stale build lock {stale} (no build of it runs; a build killed mid-way left it, and "
        "every build of the op would wait on it forever)"}


def test_a_lock_under_the_default_cache_folder_is_found_too(tmp_path):
    lock = tmp_path / "torch_extensions" / "py311_cu121" / "cpu_adam" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    assert buildlocks.clear_stale_locks({"XDG_CACHE_HOME": str(tmp_path)}) == [lock] and not lock.exists()


def test_a_lock_whose_build_runs_is_left_alone(tmp_path):
    lock = tmp_path / "ext" / "fused_adam" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    build = subprocess.Popen(["sleep", "30"], cwd=lock.parent)  # ninja, working in the op's folder
    try:
        assert buildlocks.clear_stale_locks({"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}) == []
        assert lock.exists()
    finally:
        build.kill()
        build.wait()
    assert buildlocks.clear_stale_locks({"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}) == [lock]


def test_the_drivers_stop_during_a_build_leaves_no_lock_behind(tmp_path):
    env = extensions(tmp_path, build_s=300)
    lock = Path(env["TORCH_EXTENSIONS_DIR"]) / "op" / "lock"

    def stop_once_building():
        deadline = time.monotonic() + 30
        while not lock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)  # a preemption, say

    threading.Thread(target=stop_once_building, daemon=True).start()
    result = run_build(tmp_path, env, timeout_s=60)
    assert result.stopped_as == "preempted" and result.wall_time_s < 30
    assert not lock.exists()


def test_no_step_within_the_startup_timeout_is_a_timeout_naming_the_logs_last_line(tmp_path):
    env = extensions(tmp_path, build_s=300)  # a build that outlasts the start-up allowed
    result = run_build(tmp_path, env, timeout_s=120, stall=StartupWatch(tmp_path, startup_timeout_s=1))
    assert result.wall_time_s < 60
    status, reason = launch.classify(result, tmp_path, steps_completed=0, steps_wanted=4)
    assert status == "timeout"
    assert reason.startswith("no step within ") and reason.endswith(
        "s of the launch (launcher.startup_timeout_s); the worker log's last line: building op")


def test_the_startup_watch_stops_counting_at_the_first_step(tmp_path):
    clock = [0.0]
    watch = StartupWatch(tmp_path, startup_timeout_s=10, clock=lambda: clock[0])
    clock[0] = 5
    assert watch() is None
    (tmp_path / "steps.jsonl").write_text(json.dumps({"step": 0}) + "\n")
    clock[0] = 500
    assert watch() is None  # the stall watch's, from here on
    fresh = StartupWatch(tmp_path / "none", startup_timeout_s=10, clock=lambda: clock[0])
    clock[0] = 511
    assert fresh().endswith("the worker log's last line: (none)")


@pytest.mark.slow
def test_a_point_hung_before_step_0_ends_as_timeout_at_the_startup_timeout(tmp_path):
    proc = harness_run(tmp_path, "logger=none", "debug.fault=hang", "debug.fault_step=0",
                       "launcher.startup_timeout_s=20")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "timeout", proc.stderr[-3000:]
    assert summary["reason"].startswith("no step within ") and "the worker log's last line: " in summary["reason"]
    assert summary["wall_time_s"] < 200  # not launcher.timeout_s (1800 s)
