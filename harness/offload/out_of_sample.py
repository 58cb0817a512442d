"""The planner tested on runs it was not calibrated on: each profile.json of a sweep planned again for every other
point of our pass with the same model and shape (other budgets, the device rule, other repeats), its predicted
peak set against that point's measured final-phase peak. `harness plan --out-of-sample SWEEP_DIR` prints the pairs
as JSON; the report reads them through that command (analysis/prediction.py), since the analysis imports only
the contract, never this package.

A run's own plan predicts its peak from a profile calibrated on that run's steady step (profile.calibrate), so its
error is small by construction. Here the profile comes from another run: its calibration, allocator overhead and
graphs are that run's; the point planned takes only its configuration (budget, rule, policies, device size).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.contract import reader, runfiles
from harness.contract.budget import finished_peak_bytes, resolve_budget_bytes
from harness.contract.checks import lookup
from harness.contract.errors import ConfigError
from harness.offload import peak_cap_bytes
from harness.offload.plan import Plan, device_limit_bytes, plan_offload
from harness.offload.profile import load_profile, missing_readings

# What a profile depends on besides the run: two points agreeing on these profile the same graphs and the same
# memory around them. The composed passes (offload.compose) add what they hold, measured in their own run, so
# composition is part of the shape; so are the gradient reduce buckets (persistent device memory), the optimizer's
# sub-groups (the states the plan moves) and its implementation (the step's transient memory), and the allocator's
# settings (the overhead the device rule plans under is measured on the run). Our arm has no DeepCompile schedule
# knob (an experiment's arm.schedule is unread there), so it is no part of the shape.
SHAPE_KEYS = ("model.name", "train.seq_len", "train.micro_batch", "train.grad_accum", "train.dtype",
              "train.reduce_bucket_size", "train.sub_group_size", "train.torch_adam", "env.pytorch_cuda_alloc_conf",
              "launcher.nproc_per_node", "launcher.nnodes", "offload.compose")
RULE_OF_PLAN = {"budget": "deepspeed", "step_model": "step_model"}  # plan.json's rule -> offload.budget_rule


@dataclass(frozen=True)
class Pair:
    """One point planned on another's profile: its plan's rule and budget, predicted against measured peak."""
    profile_from: str  # the run dir whose profile.json planned it
    point: str  # the run dir planned
    rule: str
    budget_bytes: int
    offloaded_bytes: int  # by this plan, against ran_offloaded_bytes by the point's own (the planner may have changed)
    ran_offloaded_bytes: int | None
    predicted_peak_bytes: int
    measured_peak_bytes: int

    @property
    def error(self) -> float:
        return (self.predicted_peak_bytes - self.measured_peak_bytes) / self.measured_peak_bytes


def shape(config: Mapping[str, Any]) -> tuple:
    return tuple(lookup(config, key, None) for key in SHAPE_KEYS)


def plan_as(point: reader.RunFiles, profile: dict) -> Plan | None:
    """The plan our pass would have made for `point` (its budget, rule and policies, on its device) from `profile`;
    None where its plan.json names no rule (a plan from before the rules) or no device size is known."""
    offload = point.config["offload"]
    device = point.summary.get("device_memory_bytes") or profile.get("device_total_bytes")
    if point.plan is None or point.plan.rule is None or not device:
        return None
    limit = device_limit_bytes(device, profile.get("allocator_overhead_bytes"))
    reload, release = offload.get("reload", "asap"), offload.get("release", "recorded")
    if point.plan.rule == "device_limit":
        return plan_offload(profile, None, limit, reload=reload, release=release)
    budget = resolve_budget_bytes(offload.get("budget_gb"), offload.get("budget_fraction"), offload.get("margin"),
                                  device)
    return plan_offload(profile, budget, limit, RULE_OF_PLAN[point.plan.rule], reload, release,
                        peak_cap_bytes(offload))


def pairs(sweep_dir: str | Path, warn: Callable[[str], None] = lambda line: None) -> list[Pair]:
    """Every (profile, other point of its shape) pair of the sweep, in run-dir order; `warn` gets one line per
    profile that cannot predict a peak, or point that cannot be planned."""
    sweep_dir = Path(sweep_dir)
    planned = [point for point in reader.read_sweep(sweep_dir).points if point.plan is not None]
    found = []
    for source in planned:
        profile_file = runfiles.profile_file(sweep_dir / source.run_dir)
        if profile_file is None:
            continue
        try:
            profile = load_profile(profile_file)
        except ConfigError as error:
            warn(f"warning: {error}; not planned from")
            continue
        if missing_readings(profile):
            warn(f"warning: {profile_file} has no {' or '.join(missing_readings(profile))} (recorded before the "
                 "step model): it predicts no peak")
            continue
        for target in planned:
            measured = finished_peak_bytes(target.summary.get("status"), target.steps)
            if target is source or shape(target.config) != shape(source.config) or measured is None:
                continue
            try:
                plan = plan_as(target, profile)
            except ConfigError as error:
                warn(f"warning: {sweep_dir / target.run_dir}: {error}; not planned")
                continue
            if plan is not None:
                found.append(Pair(source.run_dir, target.run_dir, plan.rule, plan.budget_bytes, plan.offloaded_bytes,
                                  target.summary.get("planned_offload_bytes"), plan.predicted_peak_bytes, measured))
    return found


def pairs_json(found: list[Pair]) -> str:
    """The pairs as `harness plan --out-of-sample` prints them: a JSON list of objects, the error with them."""
    return json.dumps([{**asdict(pair), "error": pair.error} for pair in found], indent=2, sort_keys=True)
