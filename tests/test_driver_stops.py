"""The driver under every stop signal while no ranks run (before a point's launch, between points, after the last),
and its refusals of values it cannot read or must not show: a number of thousands of digits, a value that came from
the environment."""
import json
import os
import signal
import subprocess

import pytest
import yaml
from omegaconf import OmegaConf

from conftest import REPO_ROOT, driver_env, harness_cmd
from harness.contract.errors import ConfigError
from harness.contract.runfiles import read_jsonl
from harness.config import compose
from harness.driver import signals

FAST = ["model=tiny"]  # every point here is refused before launch (train.steps=0): no rank starts
SECRET = "hunter2-not-for-logs"


@pytest.fixture
def stop_handlers():
    """signals.install() for the test; the process's own handlers, and no signal remembered, after it."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)}
    signals.forget()
    try:
        signals.install({})
        yield
    finally:
        signals.forget()
        for signum, handler in before.items():
            signal.signal(signum, handler)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP, signal.SIGTERM])
def test_a_stop_signal_in_hydras_code_is_kept_for_the_drivers_own(stop_handlers, signum):
    signal.raise_signal(signum)  # between points: Hydra's code runs, nothing may raise inside it
    assert signals.received() == signum
    expected = KeyboardInterrupt if signum != signal.SIGTERM else signals.stops.Terminated
    with pytest.raises(expected):  # the next point's start: the driver records it stopped
        with signals.interruptible():
            pytest.fail("the driver's code ran after a stop")


def test_a_stop_signal_in_the_drivers_own_code_raises_at_once_and_once(stop_handlers):
    with pytest.raises(KeyboardInterrupt, match="SIGHUP"):
        with signals.interruptible():
            signal.raise_signal(signal.SIGHUP)
    signal.raise_signal(signal.SIGINT)  # a second one while the point is recorded does not interrupt that
    assert signals.status_of(signals.received()) == "interrupted"


def test_sigterm_is_left_to_slurm_under_slurm(stop_handlers):
    assert signal.SIGTERM not in signals.stop_signals({"SLURM_JOB_ID": "42"})
    assert signals.stop_signals({}) == (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)


def with_callback(signal_name: str, moment: str, job: int) -> list[str]:
    """Overrides adding tests/stop_callbacks.py's SignalAt to the sweep's Hydra callbacks."""
    return ["+hydra.callbacks.stop._target_=stop_callbacks.SignalAt", f"+hydra.callbacks.stop.signal_name={signal_name}",
            f"+hydra.callbacks.stop.moment={moment}", f"+hydra.callbacks.stop.job={job}"]


@pytest.mark.slow
@pytest.mark.parametrize("signal_name, moment, job, statuses, code", [
    ("SIGHUP", "job_start", 0, ["interrupted"], 130),  # before the first point's launch
    ("SIGHUP", "job_end", 0, ["config_error", "interrupted"], 130),  # between points
    ("SIGHUP", "job_end", 2, ["config_error"] * 3, 130),  # after the last point, before Hydra returns
    ("SIGINT", "job_end", 0, ["config_error", "interrupted"], 130),
    ("SIGTERM", "job_end", 1, ["config_error", "config_error", "preempted"], 143),
])
def test_a_stop_signal_while_no_point_runs_is_recorded_and_ends_the_sweep(tmp_path, signal_name, moment, job,
                                                                            statuses, code):
    env = driver_env()
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "tests"), env["PYTHONPATH"]])
    cmd = harness_cmd(tmp_path, "logger=none", "train.steps=0", "train.repeat=0,1,2", *with_callback(
        signal_name, moment, job), multirun=True, fast=FAST)
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    index = read_jsonl(tmp_path / "sweep" / "index.jsonl")
    assert [line["status"] for line in index] == statuses
    if statuses[-1] != "config_error":
        assert index[-1]["reason"] == f"{signal_name} in the driver"


# --- values the driver cannot read or must not show --------------------------------------------------------------

def test_a_number_of_thousands_of_digits_is_a_config_error_naming_its_key():
    with pytest.raises(ConfigError) as refused:
        compose.check_syntax(["train.seed=1", "train.steps=" + "9" * 5000])
    assert refused.value.key == "train.steps" and "5000 digits" in refused.value.message
    assert len(str(refused.value)) < 200


def test_an_error_never_shows_a_value_from_an_interpolation():
    written = OmegaConf.create({"train": {"steps": "${oc.env:HARNESS_TEST_SECRET}", "seed": "x${train.steps}"},
                                "logger": {"project": "${oc.env:HARNESS_TEST_SECRET}"}})
    resolved = {"train": {"steps": SECRET, "seed": f"x{SECRET}"}, "logger": {"project": SECRET}}
    for key, value in (("train.steps", SECRET), ("train.seed", f"x{SECRET}")):
        error = ConfigError(key, f"must be an integer, got {value!r}")
        hidden = compose.hide_interpolated(error, written, resolved)
        assert SECRET not in str(hidden) and hidden.key == key
        assert str(hidden) == f"{key}: must be an integer, got {compose.INTERPOLATED}"
    plain = ConfigError("train.lr", "must be a finite number, got 'abc'")
    assert compose.hide_interpolated(plain, written, resolved) is plain


@pytest.mark.slow
def test_the_driver_refuses_a_long_number_and_an_environment_value_in_one_line_without_showing_it(tmp_path):
    long_number = subprocess.run(harness_cmd(tmp_path, "logger=none", "train.steps=" + "9" * 5000, fast=FAST),
                                 cwd=tmp_path, env=driver_env(), capture_output=True, text=True, timeout=600)
    assert long_number.returncode == 2
    assert long_number.stderr.splitlines() == ["config error: train.steps: a number of 5000 digits, more than "
                                               "Python reads (4300)"]
    env = {**driver_env(), "HARNESS_TEST_SECRET": SECRET}
    secret = subprocess.run(harness_cmd(tmp_path, "logger=none", "train.steps=${oc.env:HARNESS_TEST_SECRET}",
                                        fast=FAST), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert secret.returncode == 2
    assert secret.stderr.splitlines() == [f"config error: train.steps: must be null or an integer >= 1, got "
                                          f"{compose.INTERPOLATED}"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "config_error" and SECRET not in summary["reason"]


@pytest.mark.parametrize("overrides,steps", [(["train.measure_steps=3"], 1 + 1 + 3), (["train.steps=0"], None)])
def test_config_yaml_is_written_once_with_the_settled_step_counts(tmp_path, monkeypatch, overrides, steps):
    """config.yaml is written once per point: the step counts settled (train.steps the total), or, for a refused
    point, the config as written."""
    from harness.config.compose import compose_point
    from harness.driver import app

    writes = []
    monkeypatch.setattr(app, "start_attempt", lambda run_dir, cfg: None)  # Hydra's .hydra/ files
    monkeypatch.setattr(app, "write_atomic", lambda path, text: writes.append((path.name, text)))
    monkeypatch.setattr(app, "write_json", lambda path, value: None)
    monkeypatch.setattr(app, "run_point", lambda config, run_dir, place: {"status": "ok", "launched": config})
    monkeypatch.setattr(app.console, "phase_table", lambda summary: None)
    cfg = compose_point(["model=tiny", "logger=none", "train.warmup_steps=1", *overrides])
    status = app.record_point(cfg, tmp_path, app.nodes.NodePlace(node_rank=0, nnodes=1, hosts=("localhost",)))
    assert status == ("ok" if steps else "config_error")
    assert [name for name, _ in writes] == ["config.yaml"]
    assert yaml.safe_load(writes[0][1])["train"]["steps"] == (steps if steps else 0)
