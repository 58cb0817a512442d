"""Resolve the offload memory budget to bytes, once, so every offload arm plans against one number."""
from __future__ import annotations

import math

from harness.errors import ConfigError

GB = 1e9  # budgets are in decimal gigabytes, as in DeepSpeed's DS_DC_OFFLOAD_OPT_BUDGET_GB


def is_finite_number(value) -> bool:
    """An int or float that is not a bool, NaN or infinite (a GB amount from a YAML file or a command line)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_budget_keys(budget_gb: float | None, budget_fraction: float | None, margin: float) -> None:
    """Reject budgets that cannot mean anything before a process is launched."""
    if budget_gb is not None and budget_fraction is not None:
        raise ConfigError("offload.budget_gb", "set at most one of offload.budget_gb and offload.budget_fraction")
    if budget_gb is not None and budget_gb < 0:
        raise ConfigError("offload.budget_gb", f"must be >= 0, got {budget_gb}")
    if budget_fraction is not None and not 0 <= budget_fraction <= 1:
        raise ConfigError("offload.budget_fraction", f"must be in [0, 1], got {budget_fraction}")
    if not 0 <= margin < 1:
        raise ConfigError("offload.margin", f"must be in [0, 1), got {margin}")


def resolve_budget_bytes(budget_gb: float | None, budget_fraction: float | None, margin: float,
                         device_total_bytes: int) -> int:
    """Absolute budget, else a fraction of device memory, else auto = total x (1 - margin)."""
    check_budget_keys(budget_gb, budget_fraction, margin)
    if budget_gb is not None:
        return int(budget_gb * GB)
    if budget_fraction is not None:
        return int(budget_fraction * device_total_bytes)
    return int(device_total_bytes * (1 - margin))
