"""Results folders read safely: bench, the report and load_sweep go through one reader that never imports what a
run dir names, never leaves the sweep dir, and names each bad file once while reading the rest."""
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from analysis.fixtures.synthetic import write_point
from analysis.load import load_sweep
from analysis.report import main as report_main
from conftest import REPO_ROOT, driver_env
from analysis import bench
from harness.contract.reader import PlanFacts, read_plan

FIXTURE = REPO_ROOT / "analysis" / "fixtures" / "sweep"
# A module that leaves a file behind when anything imports it; run dirs name its class as their arm.
PLANTED_MODULE = "planted_arm"
PLANTED = '''
from pathlib import Path
Path(__file__).with_name("IMPORTED").write_text("a reader ran code a run dir named")
from harness.arms.zero3 import Zero3 as Planted
'''


def plant(folder: Path) -> Path:
    """The planted module in `folder`; returns the file its import would write."""
    (folder / f"{PLANTED_MODULE}.py").write_text(PLANTED)
    return folder / "IMPORTED"


def name_the_planted_arm(config_file: Path) -> None:
    config = yaml.safe_load(config_file.read_text())
    config["arm"]["_target_"] = f"{PLANTED_MODULE}.Planted"
    config_file.write_text(yaml.safe_dump(config))


@pytest.mark.slow
def test_a_run_dir_naming_a_module_never_makes_bench_report_or_load_sweep_import_it(tmp_path, monkeypatch):
    sweep_dir = tmp_path / "sweep"
    shutil.copytree(FIXTURE, sweep_dir)
    named = sorted(sweep_dir.glob("*/config.yaml"))[0]
    name_the_planted_arm(named)
    out_dir = tmp_path / "report"
    out_dir.mkdir()
    markers = [plant(sweep_dir), plant(out_dir), plant(named.parent)]  # wherever a reader's path might start
    # The module is importable from every reader: on this process's path, the kernels' path and the cwd of bench.
    monkeypatch.syspath_prepend(str(sweep_dir))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(sweep_dir), os.environ.get("PYTHONPATH", "")]))

    sweep = load_sweep(sweep_dir)
    assert len(sweep.points) == len(list(FIXTURE.glob("*/summary.json")))  # the point stays, as an unknown arm
    [warning] = [problem.line() for problem in sweep.problems]
    assert warning.startswith(f"warning: {named}: unknown arm class '{PLANTED_MODULE}.Planted'")
    assert warning.endswith("read as an unknown arm")

    # `python -m analysis.bench .`, the usage bench's docstring gives, puts the sweep dir first on the path
    proc = subprocess.run([sys.executable, "-m", "analysis.bench", "."], cwd=sweep_dir, env=driver_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("warning:")] == \
        [warning.replace(f"{sweep_dir}/", "")]  # its files named as given: relative to "."

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as stderr:
        status = report_main([str(sweep_dir), "--out", str(out_dir)])
    assert status == 0, stderr.getvalue()
    assert PLANTED_MODULE not in sys.modules
    assert not any(marker.exists() for marker in markers)


def test_a_target_naming_a_standard_module_is_not_imported_either(tmp_path):
    run_dir = tmp_path / write_point(tmp_path, 0)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["arm"]["_target_"] = "this.Zen"  # importing `this` prints the Zen of Python
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    was_imported = "this" in sys.modules
    points = bench.load_points([tmp_path])
    assert load_sweep(tmp_path).points["arm"].tolist() == ["zero3"]
    assert points[0]["role"] is None  # an unknown arm is compared with nothing
    assert ("this" in sys.modules) == was_imported


def test_index_entries_and_run_dirs_that_leave_the_sweep_dir_are_refused(tmp_path):
    sweep_dir, outside = tmp_path / "sweep", tmp_path / "outside"
    sweep_dir.mkdir()
    outside.mkdir()
    write_point(sweep_dir, 0)
    elsewhere = write_point(outside, 1, micro_batch=4, index=False)
    with open(sweep_dir / "index.jsonl", "a") as index:
        for run_dir in (f"../outside/{elsewhere}", str(outside / elsewhere)):
            index.write(json.dumps({"run_dir": run_dir, "overrides": []}) + "\n")
    (sweep_dir / "2_linked").symlink_to(outside / elsewhere)
    sweep = load_sweep(sweep_dir)
    assert sweep.points["micro_batch"].tolist() == [2]
    assert [problem.line() for problem in sweep.problems] == [
        f"warning: {sweep_dir / 'index.jsonl'}: line(s) 2, 3 name a run_dir outside the sweep dir; ignored",
        f"warning: {sweep_dir / '2_linked'}: leads out of the sweep dir; ignored"]
    assert [point["run_dir"].name for point in bench.load_points([sweep_dir])] == [sweep.points["run_dir"][0]]


def test_wrong_typed_step_values_are_skipped_with_one_line_naming_the_file(tmp_path):
    run_dir = tmp_path / write_point(tmp_path, 0, phase_times=[(1.0, 0.5, 0.4, 0.6, 0.5)])
    steps_file = run_dir / "steps.jsonl"
    rows = [json.loads(line) for line in steps_file.read_text().splitlines()]
    rows[1]["step_time_s"] = "fast"
    rows[2]["peak_reserved_bytes"] = [1, 2]
    rows[3]["phase"] = True
    steps_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    sweep = load_sweep(tmp_path)
    assert [problem.line() for problem in sweep.problems] == [f"warning: {steps_file}: unreadable line(s) 2, 3, 4 skipped"]
    assert sweep.steps["step"].tolist() == [0, 4]


def test_numbers_too_large_for_a_float_are_skipped_not_raised(tmp_path):
    run_dir = tmp_path / write_point(tmp_path, 0, phase_times=[(1.0, 0.5, 0.4, 0.6, 0.5)])
    steps_file = run_dir / "steps.jsonl"
    rows = [json.loads(line) for line in steps_file.read_text().splitlines()]
    rows[1]["step_time_s"] = 10 ** 400  # math.isfinite raises OverflowError on it
    rows[2]["peak_reserved_bytes"] = -(10 ** 400)
    steps_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    sweep = load_sweep(tmp_path)
    assert [problem.line() for problem in sweep.problems] == [f"warning: {steps_file}: unreadable line(s) 2, 3 skipped"]
    assert sweep.steps["step"].tolist() == [0, 3, 4]


def test_bench_refuses_a_missing_dir_in_one_line(tmp_path, capsys):
    assert bench.main([str(tmp_path / "nonexistent")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'nonexistent'}: not a directory\n"
    assert bench.main([str(tmp_path)]) == 1  # a folder without points
    assert capsys.readouterr().err == f"error: {tmp_path}: no readable points\n"


@pytest.mark.parametrize("name, damage, message", [
    ("summary.json", lambda text: text[:30], "not valid JSON"),
    ("config.yaml", lambda text: "arm: [unclosed\n", "not valid YAML"),
    ("summary.json", lambda text: text.replace('"phases": [', '"phases": ["x", '), "phases must be"),
])
def test_bench_names_a_bad_file_once_and_reports_the_rest(tmp_path, capsys, name, damage, message):
    write_point(tmp_path, 0, arm="deepcompile")
    write_point(tmp_path, 1, arm="offload")
    broken = tmp_path / write_point(tmp_path, 2, arm="zero3", micro_batch=4) / name
    broken.write_text(damage(broken.read_text()))
    assert bench.main([str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    [line] = err.splitlines()
    assert line.startswith(f"warning: {broken}: {message}") and line.endswith("; point left out")
    assert "deepcompile" in out and "offload" in out and "zero3" not in out


def test_plan_json_gives_the_last_phases_rule_and_budget_and_a_bad_one_is_named_once(tmp_path):
    problems: list = []
    plan_file = tmp_path / "plan.json"
    assert read_plan(plan_file, problems) is None and problems == []  # no plan: an arm that does not plan
    plan_file.write_text(json.dumps({"0": {"rule": "budget", "budget_bytes": 5},
                                     "2": {"rule": "device_limit", "budget_bytes": 15_920_000_000}}))
    assert read_plan(plan_file, problems) == PlanFacts("device_limit", 15_920_000_000) and problems == []
    plan_file.write_text(json.dumps({"budget_bytes": 7}))  # a plan from before plans named their rule
    assert read_plan(plan_file, problems) == PlanFacts(None, 7)
    for bad in ({"rule": "os.system", "budget_bytes": 7}, {"rule": "budget", "budget_bytes": 1.5}, [1, 2]):
        plan_file.write_text(json.dumps(bad))
        assert read_plan(plan_file, problems) is None
    assert [problem.file for problem in problems] == [str(plan_file)] * 3
