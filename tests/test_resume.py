"""sweep.resume: a second call of a sweep keeps the points an earlier call finished ok with the same config and code,
and runs the rest again (harness/driver/resume.py). In process through the driver's record_point, its launch
replaced by one that records what the real one writes before and after the ranks (env.json, the summary); once
through the real driver, two calls of one sweep."""
import json
from pathlib import Path

import pytest

from conftest import harness_run, replace_launch
from harness.config.compose import compose_point
from harness.contract import runfiles
from harness.contract.runfiles import read_jsonl
from harness.driver import app, resume
from harness.driver.sinks import write_sweep_index

PLACE = app.nodes.NodePlace(node_rank=0, nnodes=1, hosts=("localhost",))
POINT = ["model=tiny", "logger=none", "train.warmup_steps=0", "train.measure_steps=3"]
KEPT_LINE = "(ok, same config and code)"


@pytest.fixture
def driver(monkeypatch) -> list[Path]:
    return replace_launch(monkeypatch)


def record(run_dir: Path, *overrides: str) -> str:
    run_dir.mkdir(parents=True, exist_ok=True)
    return app.record_point(compose_point([*POINT, *overrides]), run_dir, PLACE)


def snapshot(run_dir: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under a run dir: its modification time and content."""
    return {str(p.relative_to(run_dir)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_a_second_call_keeps_the_ok_point_unchanged_and_runs_a_failed_or_unfinished_one_again(tmp_path, driver,
                                                                                               capsys):
    ok, died, unfinished = (tmp_path / name for name in ("0_ok", "1_died", "2_unfinished"))
    assert record(ok) == "ok" and record(died, "debug.fault=kill") == "died" and record(unfinished) == "ok"
    (unfinished / runfiles.SUMMARY).unlink()  # a call killed by its time limit mid-point
    before = snapshot(ok)
    driver.clear()
    capsys.readouterr()

    assert record(ok, "sweep.resume=true") == "ok"
    assert record(died, "sweep.resume=true", "debug.fault=kill") == "died"
    assert record(unfinished, "sweep.resume=true") == "ok"
    assert driver == [died, unfinished]  # the ok point was not launched
    assert snapshot(ok) == before and not (ok / runfiles.ATTEMPTS_DIR).exists()
    assert capsys.readouterr().out.splitlines().count(f"kept: {ok} {KEPT_LINE}") == 1
    for again in (died, unfinished):
        assert (again / runfiles.ATTEMPTS_DIR / "0" / runfiles.CONFIG).is_file()  # the earlier attempt, set aside
        assert json.loads((again / runfiles.SUMMARY).read_text())["status"] in ("ok", "died")
    index = read_jsonl(write_sweep_index(tmp_path))
    assert [(line["run_dir"], line["status"]) for line in index] == [("0_ok", "ok"), ("1_died", "died"),
                                                                       ("2_unfinished", "ok")]


@pytest.mark.parametrize("change,kept", [
    ("train.lr=0.002", False),          # a measurement's setting
    ("train.measure_steps=4", False),   # the settled step counts count
    ("logger=wandb", False),            # a kept point would lack the W&B run this call asks for
    ("sweep.stable_graph_ids=false", False),  # how a point compiles, so its wall time (as sweep.reuse)
    ("sweep.reuse_repeats=true", False),  # what a repeat profiles, so its schedule and wall time
    ("launcher.timeout_s=1234", True),  # an ok point ended before any timeout
    ("launcher.log_level=DEBUG", True),
    ("sweep.strict=true", True),
])
def test_a_changed_config_value_runs_the_point_again_unless_it_cannot_change_a_measurement(tmp_path, driver,
                                                                                             monkeypatch, change, kept):
    monkeypatch.setattr(app, "mirror_point", lambda run_dir, config, summary: None)  # logger=wandb: no W&B here
    assert record(tmp_path, "sweep.resume=true") == "ok"
    driver.clear()
    assert record(tmp_path, "sweep.resume=true", change) == "ok"
    assert driver == ([] if kept else [tmp_path])
    assert (tmp_path / runfiles.ATTEMPTS_DIR).exists() is not kept


@pytest.mark.parametrize("key", ["git_sha", "git_diff_sha256", "torch", "gpu_name"])
def test_another_code_version_or_machine_in_env_json_runs_the_point_again(tmp_path, driver, key):
    assert record(tmp_path) == "ok"
    env_file = tmp_path / runfiles.ENV
    env = json.loads(env_file.read_text())
    runfiles.write_json(env_file, {**env, key: "0" * 40})  # as another commit, diff, torch or GPU would record
    driver.clear()
    assert record(tmp_path, "sweep.resume=true") == "ok"
    assert driver == [tmp_path]
    assert json.loads((tmp_path / "attempts" / "0" / runfiles.ENV).read_text())[key] == "0" * 40


def test_without_resume_every_point_runs_and_its_earlier_attempt_is_set_aside(tmp_path, driver, capsys):
    assert record(tmp_path) == "ok"
    driver.clear()
    assert record(tmp_path) == "ok"
    assert driver == [tmp_path] and (tmp_path / "attempts" / "0" / runfiles.SUMMARY).is_file()
    assert "kept:" not in capsys.readouterr().out


def test_the_verdict_names_what_differs(tmp_path, driver):
    assert resume.judge(tmp_path, lambda: pytest.fail("nothing to compare")) == resume.Verdict(False, None)
    record(tmp_path, "debug.fault=kill")
    assert resume.judge(tmp_path, lambda: pytest.fail("not ok")).why == "its earlier attempt ended died"
    record(tmp_path)
    settled = app.checked_config(app.resolved_or_written(compose_point([*POINT, "train.seed=12345"]))[0], PLACE)
    assert resume.judge(tmp_path, lambda: settled).why == "its config differs at train.seed"
    (tmp_path / runfiles.SUMMARY).write_text("{not json")
    assert resume.judge(tmp_path, lambda: settled).why == "its earlier attempt left no readable summary"


def test_config_and_env_differences_are_strict():
    assert resume.config_difference({"a": {"b": 1}}, {"a": {"b": 1}}) is None
    assert resume.config_difference({"a": {"b": 1}}, {"a": {"b": 1, "c": None}}) == "a.c"  # a key one side lacks
    assert resume.config_difference({"a": {"b": [1, 2]}}, {"a": {"b": [1, 3]}}) == "a.b"
    assert resume.config_difference(["not", "a", "config"], {"a": 1}) == runfiles.CONFIG
    same = {key: "v" for key in resume.SAME_ENV}
    assert resume.env_difference(same, {**same, "hostnames": ["elsewhere"]}) is None  # a fresh machine of its kind
    assert resume.env_difference(same, {**same, "git_sha": None}).startswith("checkout")  # no git: cannot tell
    assert resume.env_difference(None, same) == runfiles.ENV


@pytest.mark.slow
def test_a_sweep_called_again_with_resume_keeps_its_ok_point_and_runs_its_killed_one_again(tmp_path):
    sweep = ("logger=none", "debug.fault=null,kill", "debug.fault_step=1")
    first = harness_run(tmp_path, *sweep, multirun=True)
    assert first.returncode == 0, first.stderr[-3000:]
    sweep_dir = tmp_path / "sweep"
    ok_dir, killed_dir = (sweep_dir / line["run_dir"] for line in read_jsonl(sweep_dir / runfiles.INDEX))
    before = snapshot(ok_dir)

    second = harness_run(tmp_path, *sweep, "sweep.resume=true", multirun=True)  # the same folders: not in their names
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"kept: {ok_dir} {KEPT_LINE}" in second.stdout
    assert snapshot(ok_dir) == before and not (ok_dir / runfiles.ATTEMPTS_DIR).exists()
    assert (killed_dir / runfiles.ATTEMPTS_DIR / "0" / runfiles.SUMMARY).is_file()  # ran again, the first set aside
    index = read_jsonl(sweep_dir / runfiles.INDEX)
    assert [(line["run_dir"], line["status"]) for line in index] == [(ok_dir.name, "ok"), (killed_dir.name, "died")]
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir() and p.name[0].isdigit()) == [ok_dir.name,
                                                                                                  killed_dir.name]
