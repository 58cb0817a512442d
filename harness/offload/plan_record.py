"""A plan as the planner returns it (a frozen `Plan`) and as files hold it: the plan's JSON (`Plan.to_json`,
`Plan.from_json`) and plan.json, the plan a phase ran beside that phase's facts (`PlanRecord`, `plan_file_text`,
`read_plan_file`). Written and read here alone; the planner (plan.py) makes plans, and readers of a run dir that must
not import this package read plan.json through harness.contract.reader."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class Release:
    """Free an offloaded state's device block right before a forward node (release=ordered), or wait there on the
    host for its copy out (release=reclaimed)."""
    task: str
    graph_id: int
    bwd: bool
    before_node: str


@dataclass(frozen=True)
class Reload:
    """Bring an offloaded state back after a backward node."""
    task: str
    graph_id: int
    bwd: bool
    after_node: str


COMPOSED = ("prefetch_bytes", "gathered_bytes")  # a plan's keys only where offload.compose ran passes beside it


@dataclass(frozen=True)
class Plan:
    """One rank's plan (see the module docstring): which states go out, where their blocks are freed and where they
    come back, and the peak it predicts. Its JSON keys are its field names; `rule` and `outside_bytes` are null in
    plan.json files written before they existed."""
    peak_cap_bytes: int
    reload_policy: str
    release_policy: str
    releases: list[Release]
    held: list[str]
    offloaded: list[str]
    offloaded_bytes: int
    resident_bytes: int
    total_state_bytes: int
    reloads: list[Reload]
    forward_peak_bytes: int
    floor_bytes: int
    predicted_peak_bytes: int | None  # None: a profile without the step model's readings (the CLI)
    feasible: bool | None
    outside_bytes: int | None = None  # what the profiler counted outside the allocator (profile.py)
    budget_bytes: int | None = None  # the budget or device limit it was made for (the caller's)
    rule: str | None = None  # "budget", "device_limit" or "step_model"
    prefetch_bytes: int | None = None  # what DeepCompile's prefetch held beside it (offload.compose; else None)
    gathered_bytes: int | None = None  # what its selective gather kept gathered (offload.compose; else None)

    def to_dict(self) -> dict[str, Any]:
        """Its keys; plans without composition keep the keys they had before it."""
        data = dataclasses.asdict(self)
        return {key: value for key, value in data.items() if key not in COMPOSED or value is not None}

    def to_json(self) -> str:
        """Stable text for plan.json and the CLI: sorted keys, fixed indent."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=2)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Plan":
        """A plan as to_dict wrote it (keys it does not know, such as plan.json's run facts, are not its)."""
        known = {field.name for field in dataclasses.fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        return cls(**{**values, "releases": [Release(**release) for release in data["releases"]],
                      "reloads": [Reload(**reload) for reload in data["reloads"]]})

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        return cls.from_dict(json.loads(text))


@dataclass(frozen=True)
class PlanRecord:
    """The plan a phase ran, as plan.json holds it: the plan's keys beside the phase, whether the profile saw every
    graph, where the reloads were placed and which release site frees which states."""
    plan: Plan
    phase: int
    profile_complete: bool
    placements: list[dict]
    release_sites: dict[str, list[str]]

    def to_dict(self) -> dict[str, Any]:
        return {**self.plan.to_dict(), "phase": self.phase, "profile_complete": self.profile_complete,
                "placements": self.placements, "release_sites": self.release_sites}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PlanRecord":
        return cls(Plan.from_dict(data), data["phase"], data["profile_complete"], data["placements"],
                   data["release_sites"])


def plan_file_text(records: Mapping[int, PlanRecord]) -> str:
    """plan.json: the one phase's record, or, once a run has planned in more than one phase, an object keyed by
    phase number."""
    body = ({str(phase): record.to_dict() for phase, record in sorted(records.items())} if len(records) > 1
            else next(iter(records.values())).to_dict())
    return json.dumps(body, sort_keys=True, indent=2) + "\n"


def read_plan_file(text: str) -> dict[int, PlanRecord]:
    """plan.json by phase, either layout: the inverse of plan_file_text, whole plans back as the pass wrote them
    (the tests' round trip and their reading of what the pass planned). Readers of a run dir use
    harness.contract.reader.read_plan instead: the rule and budget alone, a bad file one warning, and no import of
    this package (the contract's floor is below the offload pass)."""
    data = json.loads(text)
    if "phase" in data:
        return {data["phase"]: PlanRecord.from_dict(data)}
    return {int(phase): PlanRecord.from_dict(record) for phase, record in data.items()}
