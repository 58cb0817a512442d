"""Points of a sweep from W&B, in the columns `analysis.load` gives from run files (no per-step series)."""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pandas as pd

from analysis.columns import STAT_PREFIX, SUMMARY_SCALARS, cell_value, config_row
from analysis.load import Sweep, resolved_budget_gb


def wandb_point(config: Mapping[str, Any], summary: Mapping[str, Any], run_path: str) -> dict[str, Any]:
    """The tidy row of one W&B run as the harness's mirror logs it: config = the resolved config,
    summary = {"status", "reason", ..., "final/step_time_s/median", "phase0/...", "env/torch", ...}."""
    flat = _flatten_keys(summary)
    row: dict[str, Any] = {"sweep": None, "run_dir": run_path, "overrides": ""}
    row.update(config_row(config))
    row.update({key: flat.get(key) for key in SUMMARY_SCALARS})
    phases = {match.group(1) for key in flat if (match := re.match(r"^phase(\d+)/", key))}
    row["n_phases"] = len(phases)
    row.update({key: cell_value(flat.get(key) or []) for key in ("steady_reasons", "machine_flags")})
    row.update({key.replace("/", "_"): cell_value(value) for key, value in flat.items()
                if STAT_PREFIX.match(key) or key.startswith("env/")})
    row["budget_resolved_gb"] = resolved_budget_gb(row)
    return row


def _flatten_keys(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """W&B may hand nested summary dicts back; join their keys with '/' like the logged names."""
    flat = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten_keys(value, f"{name}/"))
        else:
            flat[name] = value
    return flat


def load_wandb(project: str, group: str, api: Any = None) -> Sweep:
    """Points of one sweep from W&B (needs network): `group` is the sweep's W&B group. No per-step series."""
    if api is None:
        import wandb  # only this path needs it, and importing it is slow

        api = wandb.Api()
    rows = [wandb_point(run.config, run.summary_metrics, "/".join(run.path))
            for run in api.runs(project, filters={"group": group})]
    return Sweep(points=pd.DataFrame(rows), steps=pd.DataFrame(), problems=[])
