"""Bad input through the real driver, as a user or a script would give it: one `config error:` line and exit 2, every
file inside the sweep dir, the index written whatever happens, and exit codes a script can act on. Every point here is
refused or fails before launch, so no rank starts."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import driver_env, harness_run, unwritable
from harness.contract.runfiles import read_jsonl

FAST = ["model=tiny"]  # nothing launches: each point is refused before its ranks would start


def files_under(folder: Path) -> set[Path]:
    return {path for path in folder.rglob("*") if path.is_file()}


@pytest.mark.parametrize("overrides, key", [
    (["env.pytorch_cuda_alloc_conf=123"], "env.pytorch_cuda_alloc_conf"),  # was a TypeError in Popen
    (["train.seq_len=${oc.env:HARNESS_TEST_UNSET}"], "train.seq_len"),  # was a 90-line interpolation error
    (["++arm.name='${oc.env:HARNESS_TEST_UNSET}'"], "arm.name"),  # quoted: was a traceback naming the folder
    (["train.stepz=5"], "train.stepz"),  # was Hydra's 7-line error
    (["train.steps=["], "train.steps"),  # bad syntax
    (["logger=wandb", "arm.name=[1,2]"], "arm.name"),  # was launched, then pydantic raised in the W&B mirror
    (["env.device_memory_gb=1e300"], "env.device_memory_gb"),  # was an OverflowError, and no summary.json
    (["offload.budget_gb=1e300"], "offload.budget_gb"),
    (["+train.foo=1"], "train.foo"),  # an unknown key was accepted
])
@pytest.mark.slow
def test_bad_input_is_one_config_error_line_and_exit_2(tmp_path, overrides, key):
    proc = harness_run(tmp_path, "logger=none", *overrides, fast=FAST)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"config error: {key}: ")
    summary = tmp_path / "run" / "summary.json"
    if summary.exists():  # refused by the driver (not before Hydra): recorded, and the record agrees
        assert json.loads(summary.read_text())["status"] == "config_error"
        assert json.loads(summary.read_text())["reason"] == line.removeprefix("config error: ")


@pytest.mark.slow
def test_values_with_separators_never_leave_the_sweep_dir(tmp_path):
    sweep_dir = tmp_path / "out" / "x" / "y"
    cmd = [sys.executable, "-m", "harness.run", "-m", *FAST, "logger=none", "train.steps=0",
           "env.pytorch_cuda_alloc_conf=a/b,../../../../esc", f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=driver_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert all(sweep_dir in path.parents for path in files_under(tmp_path)), sorted(files_under(tmp_path))
    index = read_jsonl(sweep_dir / "index.jsonl")
    assert [line["status"] for line in index] == ["config_error", "config_error"]
    assert [line["overrides"][-1] for line in index] == ["env.pytorch_cuda_alloc_conf=a/b",
                                                          "env.pytorch_cuda_alloc_conf=../../../../esc"]
    assert all("/" not in line["run_dir"] for line in index)


@pytest.mark.slow
def test_a_sweep_name_that_is_a_path_is_refused_before_anything_is_written(tmp_path):
    cwd = tmp_path / "a" / "b"
    cwd.mkdir(parents=True)
    cmd = [sys.executable, "-m", "harness.run", "-m", *FAST, "logger=none", "sweep.name=../../escape"]
    proc = subprocess.run(cmd, cwd=cwd, env=driver_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith("config error: sweep.name: must be a plain name")
    assert files_under(tmp_path) == set()


@pytest.mark.slow
def test_a_removed_key_is_a_refused_point_and_the_index_is_written(tmp_path):
    proc = harness_run(tmp_path, "logger=none", "~train.repeat", fast=FAST, multirun=True)
    assert proc.returncode == 0, proc.stderr  # every point was recorded
    [line] = read_jsonl(tmp_path / "sweep" / "index.jsonl")
    assert (line["status"], line["reason"], line["repeat"]) == ("config_error", "train.repeat: missing", None)


@pytest.mark.slow
def test_a_point_whose_driver_fails_is_named_and_the_index_still_lists_the_others(tmp_path):
    sweep_dir = tmp_path / "sweep"
    first_point = sweep_dir / "0_model=tiny,train.repeat=0,train.steps=0"
    first_point.mkdir(parents=True)
    with unwritable(first_point):  # its driver cannot write its run files, nor record why
        proc = harness_run(tmp_path, "logger=none", "train.steps=0", "train.repeat=0,1", fast=FAST, multirun=True)
    assert proc.returncode == 1, proc.stderr  # a point left no summary
    index = read_jsonl(sweep_dir / "index.jsonl")
    assert [line["run_dir"] for line in index] == ["1_model=tiny,train.repeat=1,train.steps=0"]
    assert f"warning: cannot record {first_point}: " in proc.stderr
    assert f"warning: 1 point(s) left no summary: {first_point.name}" in proc.stderr


@pytest.mark.slow
def test_sweep_strict_fails_a_sweep_with_a_point_that_is_not_ok(tmp_path):
    sweep = ["logger=none", "train.steps=0", "train.repeat=0,1"]
    (tmp_path / "lenient").mkdir()
    assert harness_run(tmp_path / "lenient", *sweep, fast=FAST, multirun=True).returncode == 0
    strict = harness_run(tmp_path, *sweep, "sweep.strict=true", fast=FAST, multirun=True)
    assert strict.returncode == 1
    assert [line["status"] for line in read_jsonl(tmp_path / "sweep" / "index.jsonl")] == ["config_error"] * 2
