"""The offload memory budget: resolved to bytes once, so every offload arm plans against one number (the worker on
rank 0 before the run; `harness plan --out-of-sample` for a point planned again offline), and how far a point went
over it (summary.json's `over_budget_bytes`, which the tables and `harness bench` flag)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from harness.contract import schema
from harness.contract.statuses import OK
from harness.contract.steps import steady_peak_bytes
from harness.contract.units import GB


def check_budget_keys(budget_gb: float | None, budget_fraction: float | None, margin: float) -> None:
    """Reject budgets that cannot mean anything (a non-number, NaN, inf, out of range, both kinds set)."""
    budget = {"budget_gb": budget_gb, "budget_fraction": budget_fraction, "margin": margin}
    schema.check_group("offload", {"offload": budget}, part=schema.BudgetConfig)


def resolve_budget_bytes(budget_gb: float | None, budget_fraction: float | None, margin: float,
                         device_total_bytes: int) -> int:
    """Absolute budget, else a fraction of device memory, else auto = total x (1 - margin)."""
    check_budget_keys(budget_gb, budget_fraction, margin)
    if budget_gb is not None:
        return int(budget_gb * GB)
    if budget_fraction is not None:
        return int(budget_fraction * device_total_bytes)
    return int(device_total_bytes * (1 - margin))


def over_budget_bytes(budget_bytes: int | None, predicted_peak_bytes: int | None,
                      measured_peak_bytes: int | None) -> int | None:
    """How far a point went over the budget it planned against: by its plan's predicted peak (an infeasible plan)
    or its measured final-phase peak (finished_peak_bytes), whichever is further; 0 within it; None without a
    budget (an arm that does not offload)."""
    if budget_bytes is None:
        return None
    return max([0, *(peak - budget_bytes for peak in (predicted_peak_bytes, measured_peak_bytes) if peak is not None)])


def recorded_over_budget_bytes(summary: Mapping[str, Any], steps: Iterable[Mapping[str, Any]]) -> int | None:
    """summary.json's over_budget_bytes; for a summary written before it, the same worked out from the summary's
    budget and predicted peak and the steps' measured peak."""
    if "over_budget_bytes" in summary:
        return summary["over_budget_bytes"]
    return over_budget_bytes(summary.get("budget_bytes"), summary.get("predicted_peak_bytes"),
                             finished_peak_bytes(summary.get("status"), steps))


def finished_peak_bytes(status: str | None, steps: Iterable[Mapping[str, Any]]) -> int | None:
    """The measured final-phase peak of a point that ran every step; None for one that did not (its last phase
    is not the final one, and its status already says how it ended)."""
    return steady_peak_bytes(steps) if status == OK else None
