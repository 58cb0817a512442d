"""The tidy row of one point: which config keys become which columns, the summary flattened into stat columns,
and which columns describe a design point (as opposed to its results or how it was run)."""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import Any

from analysis.wall_split import COMPILE_COLUMNS, SPLIT_COLUMNS, split_columns
from harness.arms import known_class
from harness.contract import schema
from harness.contract.checks import lookup
from harness.contract.arm_targets import TARGET
from harness.contract.profiled_step import ProfiledStep
from harness.contract.retry_trace import RETRY_READINGS, RetryTrace

# Config keys the analysis names by a short column: the arm's name, then every key the schema marks as a column
# (harness/contract/schema/groups.py); other top-level arm knobs become arm_<knob>, and any other overridden key
# keeps its dotted name.
CONFIG_COLUMNS = {"model.name": "model", "arm.name": "arm", **schema.config_columns()}
# Keys added after some committed runs were recorded: what those runs did, which their config cannot name.
BEFORE_THE_KEY = {"offload.budget_rule": "deepspeed", "train.warmup_steps": 0, "offload.compose": "none",
                  "offload.if_infeasible": "run", "offload.launch": "forward", "train.step_sync": "device",
                  "train.gc": "auto"}
# offload.auto_rule has no such constant: before the key, our pass planned without a budget by the device rule for
# a while (its default then), and by DeepSpeed's margin before that. The plan says which (recorded_auto_rule).
AUTO_RULE = "offload.auto_rule"
SUMMARY_SCALARS = ("status", "reason", "world_size", "steps_completed", "wall_time_s", "startup_s", "budget_bytes",
                   "planned_offload_bytes", "predicted_peak_bytes", "device_memory_bytes", "steady")
# summary.json's `oom` block (where and by how much a point ran out of memory) as oom_<field> columns.
OOM_FIELDS = ("stage", "phase", "step", "requested_bytes", "free_bytes", "limit_bytes", "reserved_bytes",
              "allocated_bytes", "message")
OOM_COLUMNS = tuple(f"oom_{field}" for field in OOM_FIELDS)
# Columns saying where a point came from or what it measured, never how it was configured.
PLAN_COLUMNS = ("plan_rule", "plan_budget_bytes")  # plan.json's (harness.reader.PlanFacts)
OVER_BUDGET = "over_budget_bytes"  # summary.json's, or worked out for a summary from before it (contract.budget)
# memory_trace.json's retries of the traced step (harness/contract/retry_trace.py): in all, listed, per reading
TRACED_RETRIES, TRACED_LISTED = "traced_retries", "traced_retries_listed"
TRACED_LARGEST_MISS = "traced_largest_miss_bytes"
TRACED_FREE_AT_MISS = "traced_free_at_largest_miss_bytes"  # the largest free block its stream had then
TRACED_READING_COLUMNS = {reading: f"traced_{reading}" for reading in RETRY_READINGS}
TRACE_COLUMNS = (TRACED_RETRIES, TRACED_LISTED, TRACED_LARGEST_MISS, TRACED_FREE_AT_MISS,
                 *TRACED_READING_COLUMNS.values())
# torch_trace.json's profiled step (harness/contract/profiled_step.py): profiled_<field>, seconds and calls
PROFILED_COLUMNS = {field.name: f"profiled_{field.name}" for field in fields(ProfiledStep)}
RESULT_COLUMNS = frozenset(("sweep", "run_dir", "overrides", "n_phases", "budget_resolved_gb", OVER_BUDGET,
                            *SUMMARY_SCALARS,
                            *PLAN_COLUMNS, *SPLIT_COLUMNS, *TRACE_COLUMNS, *COMPILE_COLUMNS,
                            *PROFILED_COLUMNS.values(),
                            *OOM_COLUMNS, "steady_reasons", "machine_flags"))
STAT_PREFIX = re.compile(r"^(final|phase\d+)[_/]")
# Config that runs a point but does not define it (fault injection, logging, the driver's timeout, how many
# steps it ran and measured, whether a later call of the sweep kept it): a point with an injected fault stands where
# a real failure of the same design point would, and runs of one design point measured for longer, or run with
# sweep.resume, are repeats of it.
OPERATIONAL = re.compile(r"^(debug|logger|hydra)\.|^launcher\.(stall_|startup_)?timeout_s$"
                         r"|^(steps|warmup_steps|measure_steps)$|^sweep\.(resume|stop_at)$")
MISSING = object()  # a config key that is not there, as opposed to one set to null
OFFLOAD_GROUP = "offload."
# An offload key the point's arm reads but its other values left without effect (our pass's auto_rule beside a
# given budget): not null, which is a value the key can take; labels leave it out.
IDLE = "-"


def retry_trace_row(trace: RetryTrace) -> dict[str, Any]:
    """A traced point's retry columns."""
    return {TRACED_RETRIES: trace.retries, TRACED_LISTED: trace.listed, TRACED_LARGEST_MISS: trace.largest_miss_bytes,
            TRACED_FREE_AT_MISS: trace.free_at_largest_miss_bytes,
            **{column: trace.readings[reading] for reading, column in TRACED_READING_COLUMNS.items()}}


def profiled_step_row(step: ProfiledStep) -> dict[str, Any]:
    """A profiled point's columns."""
    return {column: getattr(step, name) for name, column in PROFILED_COLUMNS.items()}


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
    knobs = arm_knobs(config)
    for knob, value in arm.items():
        if knob not in ("name", TARGET) and not isinstance(value, Mapping) and (knobs is None or knob in knobs):
            row[f"arm_{knob}"] = cell_value(value)  # TARGET names the arm's class
    for key in override_keys:
        value = lookup(config, key, MISSING)
        # A Mapping is a named group (arm=zero3 -> arm.name); an arm.<key> is the arm's knob (arm_<knob>, above) or,
        # for another arm or a key its class lacks, none of this point's.
        if key in CONFIG_COLUMNS or key.startswith("arm.") or isinstance(value, Mapping):
            continue
        row[key] = overrides.get(key) if value is MISSING else cell_value(value)
    return offload_as_the_arm_read_it(row, config)


def recorded_auto_rule(config: Mapping[str, Any], plan_rule: str | None, planned: bool) -> Mapping[str, Any]:
    """The config with the auto rule that made the plan, where the config predates offload.auto_rule and our pass
    planned without a budget (`planned`: the run left a plan.json): its plan's rule `device_limit`, else (a plan
    naming a budget's rule, or none from before the device rule) DeepSpeed's `margin`. Any other config as it is."""
    known = known_class(config)
    offload = config.get("offload")
    if not planned or known is None or "auto_rule" not in known.offload_keys or not isinstance(offload, Mapping) \
            or lookup(config, AUTO_RULE, MISSING) is not MISSING or schema.budget_given(offload):
        return config
    rule = "device_limit" if plan_rule == "device_limit" else "margin"
    return {**config, "offload": {**offload, "auto_rule": rule}}


def arm_knobs(config: Mapping[str, Any]) -> set[str] | None:
    """The knobs the point's arm has (its class's fields): a key older configs wrote under `arm` that the class
    does not read (our pass's `schedule`, say) is no knob of it, and labels leave it out. None: an unknown arm."""
    known = known_class(config)
    return None if known is None else {field.name for field in fields(known)}


def offload_as_the_arm_read_it(row: dict[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """The offload group's columns as they acted on the point: null for a key its arm does not read (every config
    has the group; DeepSpeed's pass reads the budget only, eager arms nothing), IDLE for one the arm reads but its
    other values left idle (Arm.idle_offload_keys). An unknown arm keeps every value."""
    known = known_class(config)
    if known is None:
        return row
    offload = {name: lookup(config, OFFLOAD_GROUP + name, BEFORE_THE_KEY.get(OFFLOAD_GROUP + name))
               for name in known.offload_keys}
    idle = known.idle_offload_keys(offload)
    for key, column in _offload_columns(row):
        name = key.removeprefix(OFFLOAD_GROUP)
        if name not in known.offload_keys:
            row[column] = None
        elif name in idle:
            row[column] = IDLE
    return row


def _offload_columns(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, column) of the row's offload keys: by their short names, and any other overridden one by its own."""
    named = [(key, column) for key, column in CONFIG_COLUMNS.items() if key.startswith(OFFLOAD_GROUP)]
    return named + [(column, column) for column in row if column.startswith(OFFLOAD_GROUP)]


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
    return {**row, **split_columns(summary)}


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
