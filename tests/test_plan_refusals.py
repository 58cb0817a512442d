"""`harness plan` on every bad profile or argument: one line on stderr, exit 2, never a traceback or a plan."""
import json
import os
import threading
from pathlib import Path

import pytest

from harness import cli

REPO_ROOT = Path(__file__).resolve().parents[1]
SMALL_PROFILE = json.loads((REPO_ROOT / "tests" / "data" / "profile_small.json").read_text())
MEASURED = {**SMALL_PROFILE, "measured_start_bytes": 10, "step_transient_bytes": 0}  # the step model's readings


def harness_plan(*args: str) -> int:
    """`harness plan ARGS` in this process: its exit status."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["plan", *args])
    return exited.value.code


def refused_in_one_line(capsys, *args: str, naming: str) -> None:
    assert harness_plan(*args) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and naming in err, err
    assert len(err) < 400  # a value of thousands of digits is never echoed whole


def with_reading(profile: dict, key: str, value) -> dict:
    return {**profile, key: value}


def write(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "profile.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


@pytest.mark.parametrize("content, naming", [
    (bytes(range(256)) * 4, "not UTF-8 text"),
    ("[" * 100_000 + "]" * 100_000, "nested deeper than 64 levels"),
    ('{"graphs": ' + "[" * 70 + "]" * 70 + "}", "nested deeper than 64 levels"),
    ("9" * 5000, "not valid JSON"),
    (json.dumps(with_reading(SMALL_PROFILE, "measured_start_bytes", 10 ** 400)), "profile.measured_start_bytes"),
    (json.dumps(with_reading(SMALL_PROFILE, "step_transient_bytes", 10 ** 20)), "profile.step_transient_bytes"),
], ids=["binary", "deep", "deep-graphs", "5000-digits", "400-digit-reading", "past-a-petabyte"])
def test_a_bad_profile_is_one_line_and_exit_2(tmp_path, capsys, content, naming):
    refused_in_one_line(capsys, "--profile", write(tmp_path, content), "--budget-gb", "1", naming=naming)


def test_a_fifo_or_a_device_for_a_profile_is_refused_without_opening_it(tmp_path, capsys):
    fifo = tmp_path / "profile.json"
    os.mkfifo(fifo)
    # Were it opened, the open would wait for a writer: one that never writes lets a regression fail, not hang.
    writer = threading.Timer(20, lambda: os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)))
    writer.start()
    try:
        refused_in_one_line(capsys, "--profile", str(fifo), "--budget-gb", "1", naming="not a regular file")
    finally:
        writer.cancel()
    refused_in_one_line(capsys, "--profile", "/dev/zero", "--budget-gb", "1", naming="not a regular file")


@pytest.mark.parametrize("args, naming", [
    (["--budget-gb=1e300"], "offload.budget_gb"),
    (["--budget-gb=inf"], "offload.budget_gb"),
    (["--device-gb=1e300"], "device_gb"),
    (["--budget-gb=1", "--budget-rule=deepspeed", "--peak-cap-gb=1e300"], "offload.peak_cap_gb"),
    (["--budget-bytes=" + "9" * 400], "offload.budget_bytes"),
    (["--budget-bytes=" + "9" * 5000], "--budget-bytes"),
], ids=["budget-1e300", "budget-inf", "device-1e300", "cap-1e300", "budget-bytes-400-digits",
        "budget-bytes-5000-digits"])
def test_a_bad_argument_is_one_line_and_exit_2(tmp_path, capsys, args, naming):
    profile = write(tmp_path, json.dumps(MEASURED))
    refused_in_one_line(capsys, "--profile", profile, *args, naming=naming)


def test_the_small_profile_still_plans(tmp_path, capsys):
    assert harness_plan("--profile", write(tmp_path, json.dumps(MEASURED)), "--budget-bytes", "80") == 0
    assert json.loads(capsys.readouterr().out)["budget_bytes"] == 80
