"""`harness report` on the committed fixture sweep (made by the harness itself, on CPU): every notebook
runs, tables hold the medians of the steps on disk, failures show their status, bad files are named."""
import contextlib
import io
import json
import shutil
import statistics
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import yaml

from analysis import budget_figures, plots, step_figures, throughput_figures
from analysis.load import load_sweep
from analysis.memory_tables import memory_table
from analysis.render import write_table
from analysis.report import NOTEBOOKS, main
from analysis.retries import retry_table
from analysis.tables import budget_table, format_number, policies_table, throughput_table

FIXTURE = Path(__file__).resolve().parents[1] / "analysis" / "fixtures" / "sweep"
TABLES = ("throughput", "memory", "policies", "budget", "retries")
# The fixture sweeps the micro-batch and the budget, so it gets every figure; per-step panels are diagnostics.
FIGURES = ("throughput_vs_micro_batch", "step_time_vs_budget", "peak_reserved_vs_budget",
           "diagnostics/step_time_s_per_step", "diagnostics/peak_reserved_bytes_per_step")
BUDGETED_ARMS = ("ds_offload", "offload")  # the fixture sweeps offload.budget_gb for these arms only


def run_report(argv):
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = main(argv)
    return status, stdout.getvalue(), stderr.getvalue()


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("report")
    status, stdout, stderr = run_report([str(FIXTURE), "--out", str(out_dir)])
    return status, stdout, stderr, out_dir


def fixture_points():
    """Each point of the fixture read by hand: (config, summary, steps)."""
    for summary_file in sorted(FIXTURE.glob("*/summary.json")):
        steps_file = summary_file.parent / "steps.jsonl"
        steps = [json.loads(line) for line in steps_file.read_text().splitlines()] if steps_file.exists() else []
        yield yaml.safe_load((summary_file.parent / "config.yaml").read_text()), \
            json.loads(summary_file.read_text()), steps


def row_label(config):
    arm = config["arm"]["name"]
    return f"{arm}, budget_gb={config['offload']['budget_gb']:g}" if arm in BUDGETED_ARMS else arm


def test_the_fixture_is_a_realistic_sweep():
    points = list(fixture_points())
    statuses = {summary["status"] for _, summary, _ in points}
    assert {"ok", "oom", "skipped", "died"} <= statuses
    ran = {config["arm"]["name"] for config, summary, _ in points if summary["status"] == "ok"}
    assert len(ran) >= 2
    assert any(len(summary["phases"]) >= 2 for _, summary, _ in points if summary["status"] == "ok")
    size = sum(path.stat().st_size for path in FIXTURE.rglob("*") if path.is_file())
    assert size < 200_000
    assert {path.name for path in FIXTURE.rglob("*") if path.is_file()} <= \
        {"config.yaml", "env.json", "steps.jsonl", "summary.json", "index.jsonl"}


@pytest.mark.slow
def test_report_executes_every_notebook_and_writes_every_file(report):
    status, stdout, stderr, out_dir = report
    assert status == 0, stderr
    assert "warning" not in stderr
    for name in NOTEBOOKS:
        notebook = nbformat.read(out_dir / "notebooks" / f"{name}.ipynb", as_version=4)
        assert any("injected-parameters" in cell.metadata.get("tags", []) for cell in notebook.cells)
        outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
        assert not [output for output in outputs if output.output_type == "error"]
    for table in TABLES:
        for suffix in (".md", ".tex", ".csv", "_values.csv"):
            assert (out_dir / "tables" / f"{table}{suffix}").stat().st_size > 0
    for figure in FIGURES:
        for suffix in (".pdf", ".png", "_data.csv"):
            assert (out_dir / "figures" / f"{figure}{suffix}").stat().st_size > 0


@pytest.mark.slow
def test_throughput_cells_are_the_medians_of_the_steps_on_disk(report):
    *_, out_dir = report
    final_medians: dict[tuple, list[tuple[float, float]]] = {}
    for config, summary, steps in fixture_points():
        if summary["status"] != "ok":
            continue
        final_phase = max(step["phase"] for step in steps)
        measured = [s for s in steps if s["phase"] == final_phase and s["phase_step"] > 0]  # compile step out
        key = (row_label(config), config["train"]["micro_batch"])
        final_medians.setdefault(key, []).append((statistics.median(s["step_time_s"] for s in measured),
                                                  statistics.median(s["tokens_per_s"] for s in measured)))
    assert any(len(repeats) > 1 for repeats in final_medians.values())
    values = pd.read_csv(out_dir / "tables" / "throughput_values.csv")
    shown = pd.read_csv(out_dir / "tables" / "throughput.csv", dtype=str, keep_default_na=False).set_index("arm")
    for (label, micro_batch), repeats in final_medians.items():
        step_time = statistics.median(seconds for seconds, _ in repeats)
        tokens_per_s = statistics.median(tokens for _, tokens in repeats)
        row = values[(values["arm"] == label) & (values["micro_batch"] == micro_batch)].iloc[0]
        assert row["final_step_time_s_median"] == pytest.approx(step_time, rel=1e-12)
        assert row["final_tokens_per_s_median"] == pytest.approx(tokens_per_s, rel=1e-12)
        assert row["n_ok"] == len(repeats)
        assert shown.loc[label, f"mb {micro_batch} s/step"].split(" ")[0] == format_number(step_time)
        assert shown.loc[label, f"mb {micro_batch} tok/s"].split(" ")[0] == format_number(tokens_per_s)


@pytest.mark.slow
def test_failed_points_appear_with_their_status(report):
    *_, out_dir = report
    shown = pd.read_csv(out_dir / "tables" / "throughput.csv", dtype=str, keep_default_na=False).set_index("arm")
    memory = pd.read_csv(out_dir / "tables" / "memory.csv", dtype=str, keep_default_na=False)
    failed = [(config, summary) for config, summary, _ in fixture_points() if summary["status"] != "ok"]
    assert failed
    for config, summary in failed:
        label, micro_batch = row_label(config), config["train"]["micro_batch"]
        cells = [shown.loc[label, f"mb {micro_batch} {name}"] for name in ("s/step", "tok/s", "vs zero3")]
        assert cells == [summary["status"].upper()] * 3
        assert summary["status"].upper() in set(memory.loc[memory["arm"].str.startswith(label), "peak reserved (GB)"])


@pytest.mark.slow
def test_report_files_equal_the_library_output_byte_for_byte(report, tmp_path):
    *_, out_dir = report
    sweep = load_sweep(FIXTURE)
    for table in (throughput_table(sweep.points), memory_table(sweep.points), policies_table(sweep.points),
                  budget_table(sweep.points), retry_table(sweep.points, sweep.steps)):
        for path in write_table(table, tmp_path):
            assert path.read_bytes() == (out_dir / "tables" / path.name).read_bytes(), path.name
    for plot, folder in ((throughput_figures.throughput_vs_micro_batch(sweep.points), "figures"),
                         (budget_figures.step_time_vs_budget(sweep.points), "figures"),
                         (step_figures.step_series(sweep.points, sweep.steps), "figures/diagnostics")):
        data = plots.save_plot(plot, tmp_path)[-1]
        assert data.read_bytes() == (out_dir / folder / data.name).read_bytes(), data.name


@pytest.mark.slow
def test_a_malformed_run_file_gives_one_line_naming_it_and_the_rest_is_reported(tmp_path):
    sweep_dir = tmp_path / "sweep"
    shutil.copytree(FIXTURE, sweep_dir)
    ok_dirs = [path.parent for path in sorted(sweep_dir.glob("*/summary.json"))
               if json.loads(path.read_text())["status"] == "ok"]
    broken_summary, broken_steps = ok_dirs[0] / "summary.json", ok_dirs[1] / "steps.jsonl"
    broken_summary.write_text(broken_summary.read_text()[:40])
    broken_steps.write_text(broken_steps.read_text() + '{"step": 8, "pha')  # a worker killed mid-line
    status, stdout, stderr, = run_report([str(sweep_dir), "--out", str(tmp_path / "out")])
    assert status == 0
    warnings = [line for line in stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2
    assert warnings[0].startswith(f"warning: {broken_summary}: not valid JSON")
    assert warnings[1].startswith(f"warning: {broken_steps}: unreadable line(s)")
    assert f"left out 1 point(s): {ok_dirs[0]}" in stdout
    values = pd.read_csv(tmp_path / "out" / "tables" / "throughput_values.csv")
    assert values["n_runs"].sum() == len(list(sweep_dir.glob("*/summary.json"))) - 1
    assert all((tmp_path / "out" / "figures" / f"{figure}.pdf").stat().st_size > 0 for figure in FIGURES)


@pytest.mark.slow
def test_wrong_typed_step_values_are_named_once_and_every_notebook_still_runs(tmp_path):
    sweep_dir = tmp_path / "sweep"
    shutil.copytree(FIXTURE, sweep_dir)
    ok_dirs = [path.parent for path in sorted(sweep_dir.glob("*/summary.json"))
               if json.loads(path.read_text())["status"] == "ok" and (path.parent / "steps.jsonl").exists()]
    damaged = []
    for run_dir, field, value in ((ok_dirs[0], "step_time_s", "fast"), (ok_dirs[1], "peak_reserved_bytes", "lots")):
        steps_file = run_dir / "steps.jsonl"
        rows = [json.loads(line) for line in steps_file.read_text().splitlines()]
        rows[1][field] = value
        steps_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
        damaged.append(steps_file)
    status, stdout, stderr = run_report([str(sweep_dir), "--out", str(tmp_path / "out")])
    assert status == 0, stderr
    assert [line for line in stderr.splitlines() if line.startswith(("warning:", "error:"))] == \
        [f"warning: {steps_file}: unreadable line(s) 2 skipped" for steps_file in damaged]


def test_report_refuses_what_is_not_a_sweep(tmp_path):
    assert run_report([str(tmp_path / "nowhere")])[0] == 2
    status, _, stderr = run_report([str(tmp_path)])
    assert status == 1 and "no readable points" in stderr
