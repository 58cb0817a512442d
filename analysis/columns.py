"""The tidy row of one point: which config keys become which columns, the summary flattened into stat columns,
and which columns describe a design point (as opposed to its results or how it was run)."""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from harness.arms.registry import TARGET
from harness.contract import schema
from harness.contract.checks import lookup

# Config keys the analysis names by a short column: the arm's name, then every key the schema marks as a column
# (harness/contract/schema/groups.py); other top-level arm knobs become arm_<knob>, and any other overridden key
# keeps its dotted name.
CONFIG_COLUMNS = {"model.name": "model", "arm.name": "arm", **schema.config_columns()}
# Keys added after some committed runs were recorded: what those runs did, which their config cannot name.
BEFORE_THE_KEY = {"offload.budget_rule": "deepspeed", "train.warmup_steps": 0}
SUMMARY_SCALARS = ("status", "reason", "world_size", "steps_completed", "wall_time_s", "budget_bytes",
                   "planned_offload_bytes", "predicted_peak_bytes", "device_memory_bytes", "steady")
# summary.json's `oom` block (where and by how much a point ran out of memory) as oom_<field> columns.
OOM_FIELDS = ("stage", "phase", "step", "requested_bytes", "free_bytes", "limit_bytes", "reserved_bytes",
              "allocated_bytes", "message")
OOM_COLUMNS = tuple(f"oom_{field}" for field in OOM_FIELDS)
# Columns saying where a point came from or what it measured, never how it was configured.
RESULT_COLUMNS = frozenset(("sweep", "run_dir", "overrides", "n_phases", "budget_resolved_gb", *SUMMARY_SCALARS,
                            *OOM_COLUMNS, "steady_reasons", "machine_flags"))
STAT_PREFIX = re.compile(r"^(final|phase\d+)[_/]")
# Config that runs a point but does not define it (fault injection, logging, the driver's timeout, how many
# steps it ran and measured): a point with an injected fault stands where a real failure of the same design point
# would, and runs of one design point measured for longer are repeats of it.
OPERATIONAL = re.compile(r"^(debug|logger|hydra)\.|^launcher\.(stall_)?timeout_s$"
                         r"|^(steps|warmup_steps|measure_steps)$")
MISSING = object()  # a config key that is not there, as opposed to one set to null


def is_config_column(column: str) -> bool:
    return column not in RESULT_COLUMNS and not column.startswith("env_") and not STAT_PREFIX.match(column)


def is_design_column(column: str) -> bool:
    return is_config_column(column) and not OPERATIONAL.match(column)


def cell_value(value: Any) -> Any:
    """Lists and dicts become JSON text so that points can be grouped and compared by them."""
    if isinstance(value, (list, tuple, Mapping)):
        return json.dumps(value, sort_keys=True)
    return value


def config_row(config: Mapping[str, Any], override_keys: Iterable[str] = (),
               overrides: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Config columns of one point: the standard short names, arm knobs, then any other overridden key,
    by its value in the config, or as written in the override when the config has no such key (a group
    choice that the resolved config does not name, e.g. '+experiments/pr8186_rows=zero3')."""
    overrides = overrides or {}
    row = {column: cell_value(lookup(config, key, BEFORE_THE_KEY.get(key))) for key, column in CONFIG_COLUMNS.items()}
    arm = config.get("arm") if isinstance(config.get("arm"), Mapping) else {}
    covered = set(CONFIG_COLUMNS)
    for knob, value in arm.items():
        if knob not in ("name", TARGET) and not isinstance(value, Mapping):  # TARGET names the arm's class
            row[f"arm_{knob}"] = cell_value(value)
            covered.add(f"arm.{knob}")
    for key in override_keys:
        value = lookup(config, key, MISSING)
        if key in covered or isinstance(value, Mapping):  # a Mapping is a named group: arm=zero3 -> arm.name
            continue
        row[key] = overrides.get(key) if value is MISSING else cell_value(value)
    return row


def summary_row(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Status, run facts, the oom block and every phase's stats flattened: oom_phase, phase0_step_time_s_median,
    final_n, ..."""
    row = {key: summary.get(key) for key in SUMMARY_SCALARS}
    machine = summary.get("machine")
    row["steady_reasons"] = cell_value(_texts(summary.get("steady_reasons")))
    row["machine_flags"] = cell_value(_texts(machine.get("flags") if isinstance(machine, Mapping) else None))
    oom = summary.get("oom")  # null, or missing in summaries older than the capacity campaign
    row.update({f"oom_{field}": oom.get(field) if isinstance(oom, Mapping) else None for field in OOM_FIELDS})
    phases = summary.get("phases") or []
    row["n_phases"] = len(phases)
    for position, phase in enumerate(phases):
        row.update(_flatten_stats(phase, f"phase{phase.get('phase', position)}"))
    if summary.get("final"):
        row.update(_flatten_stats(summary["final"], "final"))
    return row


def _texts(value: Any) -> list[str]:
    """A list of reasons or flags as summary.json holds it; anything else (older or foreign files) as none."""
    return [text for text in value if isinstance(text, str)] if isinstance(value, list) else []


def _flatten_stats(stats: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    flat = {}
    for name, value in stats.items():
        if isinstance(value, Mapping):
            flat.update({f"{prefix}_{name}_{stat}": number for stat, number in value.items()})
        else:
            flat[f"{prefix}_{name}"] = cell_value(value)
    return flat
