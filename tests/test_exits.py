"""What the driver's exit code says and when a stop signal ends a sweep; recording a point never raises."""
import json
import signal

import pytest
from omegaconf import OmegaConf

from conftest import unwritable
from harness.contract import exits
from harness.cluster import stops
from harness.cluster.nodes import NodePlace
from harness.driver.app import record_failure

WORKSTATION = NodePlace(0, 1, ("h",))
SLURM_JOB = NodePlace(0, 1, ("h",), job_id="42")


@pytest.mark.parametrize("status, code", [("ok", 0), ("config_error", 2), ("oom", 1), ("died", 1), ("timeout", 1),
                                          ("skipped", 1), ("error", 1), ("preempted", 1)])
def test_a_single_point_exits_0_only_when_ok(status, code):
    assert exits.point_exit_code(status) == code


def test_a_sweep_exits_0_when_every_point_was_recorded_unless_strict():
    assert exits.sweep_exit_code(["ok", "oom", "config_error"], unrecorded=0, strict=False) == 0
    assert exits.sweep_exit_code(["ok", "oom"], unrecorded=0, strict=True) == 1
    assert exits.sweep_exit_code(["ok", "ok"], unrecorded=0, strict=True) == 0
    assert exits.sweep_exit_code(["ok"], unrecorded=1, strict=False) == 1


def test_sigterm_ends_the_sweep_outside_slurm_only():
    assert stops.ends_the_sweep("preempted", WORKSTATION) and not stops.ends_the_sweep("preempted", SLURM_JOB)
    assert stops.ends_the_sweep("interrupted", WORKSTATION) and stops.ends_the_sweep("interrupted", SLURM_JOB)
    assert not stops.ends_the_sweep("died", WORKSTATION)
    assert (exits.stopped_exit_code("preempted"), exits.stopped_exit_code("interrupted")) == (143, 130)
    # what a SIGTERM is recorded as did not change: preemption, or SLURM's time limit near the job's end
    assert stops.stop_status(signal.SIGTERM, end_time=None, now=0) == "preempted"
    assert stops.stop_status(signal.SIGTERM, end_time=100.0, now=99.0) == "timeout"
    assert stops.stop_status(signal.SIGTERM, end_time=100.0, now=10.0) == "preempted"


def test_recording_a_failure_in_an_unwritable_run_dir_is_one_line_not_an_exception(tmp_path, capsys):
    cfg = OmegaConf.create({"arm": {"name": "zero3"}, "model": {"name": "tiny"}})
    with unwritable(tmp_path):
        assert record_failure(cfg, tmp_path, WORKSTATION, "error", "PermissionError: boom") == "error"
    assert not (tmp_path / "summary.json").exists()
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"warning: cannot record {tmp_path}: ") and err[1] == "status: error (PermissionError: boom)"


def test_a_failure_after_the_summary_leaves_it_and_says_what_it_recorded(tmp_path, capsys):
    (tmp_path / "summary.json").write_text(json.dumps({"status": "ok"}))
    cfg = OmegaConf.create({"arm": {"name": "zero3"}})
    assert record_failure(cfg, tmp_path, WORKSTATION, "error", "ValueError: late") == "error"
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "ok"
    assert capsys.readouterr().err == "status: ok (recorded before the driver ended: ValueError: late)\n"
