"""Resolve the offload memory budget to bytes, once, so every offload arm plans against one number."""
from __future__ import annotations

from harness.checks import Number
from harness.errors import ConfigError
from harness.units import GB
BUDGET_GB = Number(low=0, nullable=True)
BUDGET_FRACTION = Number(low=0, high=1, nullable=True)
MARGIN = Number(low=0, high=1, high_open=True)


def check_budget_keys(budget_gb: float | None, budget_fraction: float | None, margin: float) -> None:
    """Reject budgets that cannot mean anything (a non-number, NaN, inf, out of range) before a process is launched."""
    BUDGET_GB.check("offload.budget_gb", budget_gb)
    BUDGET_FRACTION.check("offload.budget_fraction", budget_fraction)
    MARGIN.check("offload.margin", margin)
    if budget_gb is not None and budget_fraction is not None:
        raise ConfigError("offload.budget_gb", "set at most one of offload.budget_gb and offload.budget_fraction")


def resolve_budget_bytes(budget_gb: float | None, budget_fraction: float | None, margin: float,
                         device_total_bytes: int) -> int:
    """Absolute budget, else a fraction of device memory, else auto = total x (1 - margin)."""
    check_budget_keys(budget_gb, budget_fraction, margin)
    if budget_gb is not None:
        return int(budget_gb * GB)
    if budget_fraction is not None:
        return int(budget_fraction * device_total_bytes)
    return int(device_total_bytes * (1 - margin))
