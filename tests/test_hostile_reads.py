"""A results folder built to hurt its reader: links out of the sweep dir, nesting deep enough to overflow the stack,
YAML alias bombs, FIFOs and devices, wrong-typed config values. load_sweep and bench read on past each bad file
with one warning naming it; nothing outside the sweep dir reaches a row; nothing hangs."""
import gzip
import json
import os
import shutil
import threading
from pathlib import Path

import pytest
import yaml

from analysis import bench
from analysis.fixtures.synthetic import write_point
from analysis.load import load_sweep
from harness.contract import safe_read

DEEP = 100_000  # far past the interpreter's recursion limit


def warnings_of(sweep_dir: Path) -> list[str]:
    return [problem.line() for problem in load_sweep(sweep_dir).problems]


def two_points(sweep_dir: Path) -> tuple[Path, Path]:
    """A sweep of two points (micro_batch 2 and 4), each with steps.jsonl; their run dirs."""
    sweep_dir.mkdir(exist_ok=True)
    first = sweep_dir / write_point(sweep_dir, 0, phase_times=[(1.0, 0.5, 0.4)])
    second = sweep_dir / write_point(sweep_dir, 1, micro_batch=4, phase_times=[(1.0, 0.5, 0.4)])
    return first, second


def bench_warnings(sweep_dir: Path) -> tuple[list[dict], list[str]]:
    problems: list = []
    points = bench.load_points([sweep_dir], problems)
    return points, [problem.line() for problem in problems]


# --- defect 2: run files linked out of the sweep dir ----------------------------------------------------------

@pytest.mark.parametrize("name", ["config.yaml", "summary.json"])
def test_a_config_or_summary_linked_out_of_the_sweep_dir_is_not_read(tmp_path, name):
    sweep_dir, outside = tmp_path / "sweep", tmp_path / "outside"
    first, _ = two_points(sweep_dir)
    outside.mkdir()
    outside_dir = outside / write_point(outside, 5, micro_batch=64, index=False)
    (first / name).unlink()
    (first / name).symlink_to(outside_dir / name)
    sweep = load_sweep(sweep_dir)
    assert sweep.points["micro_batch"].tolist() == [4]  # the outside point's 64 never reaches a row
    assert [problem.line() for problem in sweep.problems] == [
        f"warning: {first / name}: leads out of {sweep_dir.resolve()}; not read; point left out"]
    points, lines = bench_warnings(sweep_dir)
    assert [point["run_dir"] for point in points] == [sweep_dir / sweep.points["run_dir"][0]] and lines


def test_env_and_steps_linked_out_of_the_sweep_dir_are_not_read(tmp_path):
    sweep_dir, outside = tmp_path / "sweep", tmp_path / "outside"
    first, _ = two_points(sweep_dir)
    outside.mkdir()
    (outside / "env.json").write_text(json.dumps({"secret": "outside"}))
    (outside / "steps.jsonl").write_text((first / "steps.jsonl").read_text().replace('"step": 0', '"step": 77'))
    for name in ("env.json", "steps.jsonl"):
        (first / name).unlink()
        (first / name).symlink_to(outside / name)
    sweep = load_sweep(sweep_dir)
    assert "env_secret" not in sweep.points.columns
    assert 77 not in sweep.steps["step"].tolist() and len(sweep.points) == 2
    assert [problem.line() for problem in sweep.problems] == [
        f"warning: {first / 'env.json'}: leads out of {sweep_dir.resolve()}; not read; env columns left empty",
        f"warning: {first / 'steps.jsonl'}: leads out of {sweep_dir.resolve()}; not read; no per-step series "
        "for this point"]


def test_an_index_and_hydra_overrides_linked_out_of_the_sweep_dir_are_not_read(tmp_path):
    sweep_dir, outside = tmp_path / "sweep", tmp_path / "outside"
    first, second = two_points(sweep_dir)
    outside.mkdir()
    (outside / "index.jsonl").write_text(json.dumps({"run_dir": first.name, "overrides": ["outside.key=1"]}) + "\n")
    (outside / "overrides.yaml").write_text(yaml.safe_dump(["outside.other=2"]))
    (sweep_dir / "index.jsonl").unlink()
    (sweep_dir / "index.jsonl").symlink_to(outside / "index.jsonl")
    (second / ".hydra" / "overrides.yaml").unlink()
    (second / ".hydra" / "overrides.yaml").symlink_to(outside / "overrides.yaml")
    sweep = load_sweep(sweep_dir)
    assert len(sweep.points) == 2  # both run dirs found on disk
    assert not any("outside" in overrides for overrides in sweep.points["overrides"])
    assert [problem.line() for problem in sweep.problems] == [
        f"warning: {sweep_dir / 'index.jsonl'}: leads out of {sweep_dir.resolve()}; not read",
        f"warning: {second / '.hydra' / 'overrides.yaml'}: leads out of {sweep_dir.resolve()}; not read"]


def test_a_link_that_stays_inside_the_sweep_dir_is_read(tmp_path):
    first, second = two_points(tmp_path / "sweep")
    (second / "env.json").unlink()
    (second / "env.json").symlink_to(first / "env.json")
    assert warnings_of(tmp_path / "sweep") == []


# --- defects 3 and 4: nesting past the stack, YAML alias bombs ---------------------------------------------------

DEEP_JSON = "[" * DEEP + "]" * DEEP
DEEP_YAML = "arm: " + "[" * DEEP + "]" * DEEP + "\n"
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + level)}: &{chr(98 + level)} [{', '.join(['*' + chr(97 + level)] * 10)}]\n" for level in range(8)) \
    + "model: {name: tiny}\narm: {name: zero3, knobs: *i}\n"  # 10**9 leaves: gigabytes once walked


@pytest.mark.parametrize("name, text, left_out", [
    ("config.yaml", DEEP_YAML, True),
    ("summary.json", DEEP_JSON, True),
    ("env.json", DEEP_JSON, False),
    ("plan.json", DEEP_JSON, False),
    ("config.yaml", ALIAS_BOMB, True),
], ids=["deep-config", "deep-summary", "deep-env", "deep-plan", "alias-bomb-config"])
def test_deep_nesting_and_alias_bombs_are_one_warning_not_a_crash(tmp_path, name, text, left_out):
    first, _ = two_points(tmp_path)
    (first / name).write_text(text)
    sweep = load_sweep(tmp_path)
    [line] = [problem.line() for problem in sweep.problems]
    message = "holds a YAML alias" if "&a" in text else "nested deeper than 64 levels"
    assert line.startswith(f"warning: {first / name}: {message}")
    assert len(sweep.points) == (1 if left_out else 2)
    points, lines = bench_warnings(tmp_path)
    assert lines == [line] and len(points) == len(sweep.points)


def test_a_deep_line_in_steps_or_the_index_is_skipped_like_any_bad_line(tmp_path):
    first, _ = two_points(tmp_path)
    with open(first / "steps.jsonl", "a") as steps:
        steps.write(DEEP_JSON + "\n")
    with open(tmp_path / "index.jsonl", "a") as index:
        index.write(json.dumps({"run_dir": "x", "overrides": json.loads("[" * 80 + "]" * 80)}) + "\n")
        index.write(DEEP_JSON + "\n")
    sweep = load_sweep(tmp_path)
    assert [problem.line() for problem in sweep.problems] == [
        f"warning: {tmp_path / 'index.jsonl'}: unreadable line(s) 3, 4",
        f"warning: {first / 'steps.jsonl'}: unreadable line(s) 4 skipped"]
    assert len(sweep.steps) == 6


# --- defect 5: FIFOs and devices ----------------------------------------------------------------------------------

def read_within(seconds: float, read):
    """`read()`'s result, failing the test if it has not returned within `seconds` (a reader blocked on a FIFO)."""
    result: list = []

    def run():
        try:
            result.append(read())
        except Exception as error:  # raised again in the test's thread
            result.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the reader blocked"
    if isinstance(result[0], Exception):
        raise result[0]
    return result[0]


@pytest.mark.parametrize("name", ["config.yaml", "summary.json", "env.json", "steps.jsonl", "plan.json",
                                  "index.jsonl"])
def test_a_fifo_for_a_run_file_is_refused_without_blocking(tmp_path, name):
    first, _ = two_points(tmp_path)
    fifo = (tmp_path if name == "index.jsonl" else first) / name
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    sweep = read_within(30, lambda: load_sweep(tmp_path))
    [line] = [problem.line() for problem in sweep.problems]
    assert line.startswith(f"warning: {fifo}: not a regular file")
    assert len(sweep.points) == (1 if name in ("config.yaml", "summary.json") else 2)
    read_within(30, lambda: bench.load_points([tmp_path]))


def test_a_device_is_refused_from_its_stat_and_an_oversized_file_by_its_size(tmp_path):
    with pytest.raises(safe_read.RefusedFile, match="not a regular file"):
        read_within(30, lambda: safe_read.read_text("/dev/zero", root="/"))
    big = tmp_path / "summary.json"
    big.write_text(" " * 2048)
    with pytest.raises(safe_read.RefusedFile, match="larger than 1024 bytes"):
        safe_read.read_text(big, max_bytes=1024)
    binary = tmp_path / "env.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(safe_read.RefusedFile, match="not UTF-8 text"):
        safe_read.read_json(binary)


def test_a_gzip_profile_reads_as_its_text_and_one_that_inflates_past_the_limit_or_is_cut_is_refused(tmp_path):
    profile = tmp_path / "profile.json.gz"
    profile.write_bytes(gzip.compress(json.dumps({"graphs": []}).encode(), mtime=0))
    assert safe_read.read_json(profile) == {"graphs": []}
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b" " * 4096))  # ~40 bytes on disk, 4 kB inflated
    assert bomb.stat().st_size < 1024
    with pytest.raises(safe_read.RefusedFile, match="inflates past 1024 bytes"):
        safe_read.read_text(bomb, max_bytes=1024)
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(profile.read_bytes()[:-6])  # the trailer's check sum and length lost
    with pytest.raises(safe_read.RefusedFile, match="not one whole gzip stream"):
        safe_read.read_text(cut)
    plain = tmp_path / "plain.json.gz"  # named .gz, but not gzip
    plain.write_text("{}")
    with pytest.raises(safe_read.RefusedFile, match="not gzip"):
        safe_read.read_text(plain)

# --- defect 7: wrong-typed config values ----------------------------------------------------------------------------

@pytest.mark.parametrize("key, value, message", [
    ("train.micro_batch", "eight", "train.micro_batch: must be a number one can compute with, got 'eight'"),
    ("train.seq_len", [64, 128], "train.seq_len: must be a number one can compute with, got [64, 128]"),
    ("offload.budget_gb", 10 ** 400, "offload.budget_gb: must be a number one can compute with, got an integer "
                                     "of 401 digits"),
    ("offload.mode", {"nested": 1}, "offload.mode: must be a single value, got {'nested': 1}"),
])
def test_a_wrong_typed_config_value_is_named_and_its_point_left_out(tmp_path, key, value, message):
    first, _ = two_points(tmp_path)
    config = yaml.safe_load((first / "config.yaml").read_text())
    group, name = key.split(".")
    config[group][name] = value
    (first / "config.yaml").write_text(yaml.safe_dump(config))
    sweep = load_sweep(tmp_path)
    assert [problem.line() for problem in sweep.problems] == [
        f"warning: {first / 'config.yaml'}: {message}; point left out"]
    assert sweep.points["micro_batch"].tolist() == [4]
    points, lines = bench_warnings(tmp_path)
    assert lines == [f"warning: {first / 'config.yaml'}: {message}; point left out"] and len(points) == 1


def test_values_an_older_harness_wrote_still_read(tmp_path):
    """Only the type is checked: a choice recorded as a number, a null number, a value out of today's range."""
    first, _ = two_points(tmp_path)
    config = yaml.safe_load((first / "config.yaml").read_text())
    config["offload"].update(streams=2, margin=None, budget_gb=-1)
    (first / "config.yaml").write_text(yaml.safe_dump(config))
    assert warnings_of(tmp_path) == []


def test_the_committed_fixture_reads_without_a_warning():
    fixture = Path(__file__).resolve().parents[1] / "analysis" / "fixtures" / "sweep"
    assert warnings_of(fixture) == []



# --- defect 1: code planted in the report's output dir -------------------------------------------------------------

PLANTED_PANDAS = 'from pathlib import Path\nPath(__file__).with_name("PANDAS_IMPORTED").write_text("ran")\n'
PLANTED_RC = "backend: module://planted_backend\n"  # matplotlib would import this module, found on the cwd


@pytest.mark.slow
def test_report_kernels_never_run_code_or_honour_settings_planted_in_the_output_dir(tmp_path):
    from analysis.report import run_notebook

    fixture = Path(__file__).resolve().parents[1] / "analysis" / "fixtures" / "sweep"
    out_dir = tmp_path / "report"
    out_dir.mkdir()
    (out_dir / "pandas.py").write_text(PLANTED_PANDAS)
    (out_dir / "matplotlibrc").write_text(PLANTED_RC)
    (out_dir / "planted_backend.py").write_text(PLANTED_PANDAS.replace("PANDAS", "BACKEND"))
    assert run_notebook("memory", fixture, out_dir)
    assert not (out_dir / "PANDAS_IMPORTED").exists() and not (out_dir / "BACKEND_IMPORTED").exists()
    assert list((out_dir / "figures").rglob("*.png"))  # the notebook drew its figures


@pytest.mark.slow
def test_every_report_notebook_runs_past_a_wrong_typed_config(tmp_path, capsys):
    from analysis.report import main as report_main

    fixture = Path(__file__).resolve().parents[1] / "analysis" / "fixtures" / "sweep"
    sweep_dir = tmp_path / "sweep"
    shutil.copytree(fixture, sweep_dir)
    bad = sorted(sweep_dir.glob("*/config.yaml"))[0]
    config = yaml.safe_load(bad.read_text())
    config["train"]["micro_batch"] = "eight"
    bad.write_text(yaml.safe_dump(config))
    assert report_main([str(sweep_dir), "--out", str(tmp_path / "report")]) == 0
    assert f"warning: {bad}: train.micro_batch: must be a number one can compute with, got 'eight'; point left " \
           "out" in capsys.readouterr().err.splitlines()
