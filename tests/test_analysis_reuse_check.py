"""The reuse check (analysis/reuse_check.py): a point that reused its sweep's DeepCompile profiles set against the same
point run cold, on a copy of results/budget_sweep's pair (ours at 12 GB), whose cold run is edited to match the
reused one, or to plan otherwise."""
import json
import shutil

import pytest

from analysis.load import load_sweep
from analysis.reuse_check import reuse_check_table
from conftest import REPO_ROOT

SWEEP = REPO_ROOT / "results" / "budget_sweep" / "sweep"
REUSED, COLD, FIRST = "9_arm=offload,offload.budget_gb=12", "cold_offload_12", "6_arm=offload,offload.budget_gb=1e-06"


@pytest.fixture
def pair(tmp_path):
    """The reused point, its cold run and the first point of its arm (which made the profiles), as a sweep."""
    sweep = tmp_path / "sweep"
    for name in (REUSED, COLD, FIRST):
        shutil.copytree(SWEEP / name, sweep / name)
    listed = [line for line in (SWEEP / "index.jsonl").read_text().splitlines()
              if (sweep / json.loads(line)["run_dir"]).exists()]
    (sweep / "index.jsonl").write_text("\n".join(listed) + "\n")
    return sweep


def reading(sweep) -> list[str]:
    loaded = load_sweep(sweep)
    return list(reuse_check_table(loaded.points, loaded.steps).values["reading"])


def test_the_committed_pair_plans_alike_and_reads_the_step_time_apart(pair):
    loaded = load_sweep(pair)
    table = reuse_check_table(loaded.points, loaded.steps).values
    (row,) = table.to_dict("records")
    assert row["same_plan"] and row["planned_offload_bytes_reused"] == row["planned_offload_bytes_cold"]
    assert row["ci95_high"] < 1 and row["reading"] == "differs: step time (faster)"


def test_a_cold_run_that_steps_as_the_reused_one_matches(pair):
    shutil.copy(pair / REUSED / "steps.jsonl", pair / COLD / "steps.jsonl")
    assert reading(pair) == ["matches"]


def test_a_cold_run_that_planned_otherwise_differs_in_its_plan(pair):
    summary = json.loads((pair / COLD / "summary.json").read_text())  # the plan's facts, as the worker records them
    summary["predicted_peak_bytes"] += 2**20
    (pair / COLD / "summary.json").write_text(json.dumps(summary))
    assert reading(pair) == ["differs: plan"]


def test_no_pair_without_a_cold_run(pair):
    shutil.rmtree(pair / COLD)
    loaded = load_sweep(pair)
    assert reuse_check_table(loaded.points, loaded.steps).values.empty
