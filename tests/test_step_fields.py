"""A step field is one declaration (harness/contract/steps.py): the rank records it, summary.json keeps its phase
statistics, W&B mirrors them and the report shows its column, with nothing else to edit."""
from __future__ import annotations

import json

import pytest

from analysis.fixtures.synthetic import write_point
from analysis.load import load_sweep
from analysis.memory_tables import memory_table
from harness.contract import runfiles, steps
from harness.contract.steps import Column, StepField
from harness.driver.sinks import flat_summary
from harness.rank.monitor import ArmCounters

SPILLED = StepField("spilled_bytes", "bytes", "arm", ranks="max", phase=("median",), cumulative=True,
                    columns=(Column("spilled/step (GB)", "median", "memory"),))


@pytest.fixture
def spilled(monkeypatch):
    """The one declaration a new field takes."""
    monkeypatch.setattr(steps, "FIELDS", (*steps.FIELDS, SPILLED))


def test_a_declared_arm_field_is_recorded_as_its_per_step_delta(spilled):
    total = {"spilled_bytes": 0}
    counters = ArmCounters(lambda: dict(total))
    total["spilled_bytes"] = 5_000_000_000
    assert steps.record(counters.step_values())["spilled_bytes"] == 5_000_000_000
    total["spilled_bytes"] = 7_000_000_000
    assert counters.step_values()["spilled_bytes"] == 2_000_000_000


def test_a_new_step_field_reaches_steps_jsonl_summary_json_wandb_and_a_report_column(spilled, tmp_path):
    run_dir = tmp_path / write_point(tmp_path, 0, arm="offload", step_values={"spilled_bytes": 2_000_000_000})
    rows = [json.loads(line) for line in (run_dir / runfiles.STEPS).read_text().splitlines()]
    assert all(row["spilled_bytes"] == 2_000_000_000 for row in rows)
    summary = json.loads((run_dir / runfiles.SUMMARY).read_text())
    assert summary["final"]["spilled_bytes"] == {"median": 2_000_000_000}
    assert flat_summary({**summary, "reason": None})["final/spilled_bytes/median"] == 2_000_000_000
    display = memory_table(load_sweep(tmp_path).points).display
    assert display[("", "spilled/step (GB)")].tolist() == ["2"]  # 2e9 bytes in GB


def test_an_undeclared_value_is_not_recorded():
    assert "spilled_bytes" not in steps.record({"step": 0, "spilled_bytes": 1})
