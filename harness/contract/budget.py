"""Resolve the offload memory budget to bytes, once, so every offload arm plans against one number (the worker on
rank 0 before the run; `harness plan --out-of-sample` for a point planned again offline)."""
from __future__ import annotations

from harness.contract import schema
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
