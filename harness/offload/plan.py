"""Pure offload planner: memory profile + optimizer-state tasks + budget -> which states to offload, where to reload.

No torch, no CUDA: the DeepCompile pass builds the profile from DeepSpeed's profiling results and calls
`make_plan(profile, budget_bytes, reload)`; the same function runs offline as
`python -m harness.offload.plan --profile profile.json --budget-gb X [--reload asap|at_end]`.

Model
-----
The profile lists the graphs of one training step in execution order (forward graphs, then backward graphs),
each with its nodes in execution order and the profiled peak bytes of each node. The graphs were profiled with
every optimizer state evicted, so a node's peak excludes all of them. A "task" is one optimizer-state tensor of
one ZeRO sub-group (fp32 master params, exp_avg or exp_avg_sq), listed in the order the optimizer step touches
them. Copies are treated as instantaneous: when they land is the runtime's concern, not the plan's.

Definitions (all in bytes):
- forward_peak = max peak over the nodes of the forward graphs (0 if they have none): the forward pass's running
  peak at its end, in execution order.
- floor = max peak over all nodes of all graphs, backward included: the step's peak with no state resident.
- last_peak = peak of the last node of the last backward graph.
- Resident set R: a prefix of the task list, grown while budget - forward_peak - bytes(R) >= bytes(next task).
  Every other task is offloaded: its device-to-host copy launches at the start of the first forward graph.
  R is sized against the forward peak, not the floor, as DeepSpeed's pass does, so both offload comparable
  bytes at the same budget; a backward node that peaks above forward_peak may then overflow (see feasible).
- Reloads happen after backward nodes. "After node X" means the task is on the device from X's successors on.
  - asap: walk the backward nodes in execution order. After node j, reload the next offloaded task (task order)
    while  later_peak(j) + in_use + cost(task) <= cap  (in_use: R, held and reloaded tasks; cost: the task's
    bytes, 0 for a held one), where later_peak(j) is the
    max peak of the backward nodes after j, in this and later backward graphs. So a reload never pushes a later
    node over the budget; where a later node exceeds it even without the reload (R, sized against the forward
    peak, can do that), the reload waits until that node has run. Tasks still pending at the last backward
    node are reloaded after it.
  - at_end: every offloaded task is reloaded after the last backward node.
- Releases (`release` policy): when an offloaded task's device block goes back to the allocator.
  - recorded: at the launch; the block is tied to the copy stream and the allocator reuses it once the copy
    has read it. The plan treats it as gone from the first node on.
  - ordered: the block stays held until a release, where the compute stream waits for that task's copy and
    frees it, so later allocations reuse it in stream order. Walk the forward nodes in execution order: before
    node i, release the next held task (task order) while  need(i) + bytes(R) + bytes(held) > cap,  where
    need(i) = peak(i), and for the last forward node max(peak, floor): backward has no release sites. A task
    never released stays on the device; its reload only points the state back at the held block (no copy).
- Reload placement and the walk below count what is on the device: R, the held tasks, and the reloaded ones.
  `cap` (default: the budget) is the limit both releases and asap reloads are placed under.
- The step's end: after the last backward node all states are back for the optimizer step. Its baseline is
  last_peak (what the last node held at most), so the end costs last_peak + total_state_bytes.
- predicted_peak = max( max over every node i in execution order, forward and backward, of
                        peak(i) + bytes(R) + bytes(held at i) + bytes(reloaded before i),
                        last_peak + total_state_bytes ).
- feasible  <=>  predicted_peak <= budget.

Consequences (release=recorded, cap = budget): budget >= forward_peak + total offloads nothing (feasible once
budget >= floor + total too); budget 0 keeps nothing resident; a larger budget offloads a subset (a suffix of
the task list shrinks).
Feasibility does not depend on the reload policy: both policies are feasible exactly when
budget >= max(floor + bytes(R), last_peak + total). at_end has the lower predicted peak (it is that max); asap's
never exceeds max(at_end's, budget) and buys earlier reloads. A plan is infeasible when floor + bytes(R) >
budget, which sizing R against the forward peak allows whenever floor > forward_peak (a backward node holds
more than any forward node), or when last_peak + total > budget; with floor > budget not even offloading
everything fits. Infeasible plans are reported, not repaired. Feasibility is therefore not monotone in the
budget: a larger budget can keep one more task resident and push the backward peak over.

Differences from DeepSpeed's pass (offload_opt_states_inc): DeepSpeed offloads the first tasks and keeps the
tail resident; its reload test leaves out the resident states and looks only at the rest of the current
backward graph.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from harness.budget import GB
from harness.errors import ConfigError
from harness.schema import OffloadConfig, choices

RELOAD_POLICIES = choices(OffloadConfig, "reload")
RELEASE_POLICIES = choices(OffloadConfig, "release")


@dataclass(frozen=True)
class Node:
    graph_id: int
    bwd: bool
    name: str
    peak_bytes: int


@dataclass(frozen=True)
class Task:
    id: str
    bytes: int


@dataclass(frozen=True)
class Profile:
    nodes: tuple[Node, ...]  # all graphs' nodes in execution order
    tasks: tuple[Task, ...]  # in the order the optimizer step touches them

    @property
    def bwd_positions(self) -> list[int]:
        return [position for position, node in enumerate(self.nodes) if node.bwd]

    @property
    def forward_peak_bytes(self) -> int:
        return max((node.peak_bytes for node in self.nodes if not node.bwd), default=0)

    @property
    def floor_bytes(self) -> int:
        return max((node.peak_bytes for node in self.nodes), default=0)

    @property
    def total_state_bytes(self) -> int:
        return sum(task.bytes for task in self.tasks)


# ---------------------------------------------------------------- validation


def _expect(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(key, message)


def _byte_count(value: Any, key: str) -> int:
    # bool is an int subclass; a true/false byte count is a malformed file, not 1 or 0 bytes.
    _expect(isinstance(value, int) and not isinstance(value, bool), key, f"must be an integer, got {value!r}")
    _expect(value >= 0, key, f"must be >= 0, got {value}")
    return value


def _mapping(value: Any, key: str) -> dict:
    _expect(isinstance(value, dict), key, f"must be an object, got {type(value).__name__}")
    return value


def _sequence(value: Any, key: str) -> list | tuple:
    _expect(isinstance(value, (list, tuple)), key, f"must be a list, got {type(value).__name__}")
    return value


def _graph_id(value: Any, key: str) -> int:
    _expect(isinstance(value, int) and not isinstance(value, bool), key, f"must be an integer, got {value!r}")
    return value


def _parse_graph(graph: Any, key: str) -> tuple[tuple[int, bool], list[Node]]:
    graph = _mapping(graph, key)
    graph_id = _graph_id(graph.get("graph_id"), f"{key}.graph_id")
    bwd = graph.get("bwd")
    _expect(isinstance(bwd, bool), f"{key}.bwd", f"must be true or false, got {bwd!r}")
    nodes, seen_names = [], set()
    for index, node in enumerate(_sequence(graph.get("nodes"), f"{key}.nodes")):
        node_key = f"{key}.nodes[{index}]"
        node = _mapping(node, node_key)
        name = node.get("name")
        _expect(isinstance(name, str) and name != "", f"{node_key}.name", f"must be a non-empty string, got {name!r}")
        # Reloads are placed by node name, so a name must say which node it is.
        _expect(name not in seen_names, f"{node_key}.name", f"duplicate node name {name!r} in this graph")
        seen_names.add(name)
        nodes.append(Node(graph_id, bwd, name, _byte_count(node.get("peak_bytes"), f"{node_key}.peak_bytes")))
    return (graph_id, bwd), nodes


def _parse_graph_order(order: Any, graphs: dict[tuple[int, bool], int]) -> list[tuple[int, bool]]:
    """Each graph exactly once, forward graphs before backward graphs (one micro-batch per step)."""
    parsed: list[tuple[int, bool]] = []
    for index, entry in enumerate(_sequence(order, "profile.graph_order")):
        key = f"profile.graph_order[{index}]"
        _expect(isinstance(entry, (list, tuple)) and len(entry) == 2, key,
                f"must be [graph_id, is_bwd], got {entry!r}")
        graph = (_graph_id(entry[0], key), entry[1])
        _expect(isinstance(graph[1], bool), key, f"is_bwd must be true or false, got {entry[1]!r}")
        _expect(graph in graphs, key, f"no graph with graph_id {graph[0]} and bwd {graph[1]} in profile.graphs")
        _expect(graph not in parsed, key, f"graph {graph[0]} (bwd {graph[1]}) listed twice")
        _expect(graph[1] or not any(bwd for _, bwd in parsed), key, "forward graph after a backward graph")
        parsed.append(graph)
    for graph, index in graphs.items():
        _expect(graph in parsed, f"profile.graphs[{index}]", "graph missing from profile.graph_order")
    return parsed


def _parse_tasks(tasks: Any) -> tuple[Task, ...]:
    parsed, seen_ids = [], set()
    for index, task in enumerate(_sequence(tasks, "profile.tasks")):
        key = f"profile.tasks[{index}]"
        task = _mapping(task, key)
        task_id = task.get("id")
        _expect(isinstance(task_id, str) and task_id != "", f"{key}.id", f"must be a non-empty string, got {task_id!r}")
        _expect(task_id not in seen_ids, f"{key}.id", f"duplicate task id {task_id!r}")
        seen_ids.add(task_id)
        parsed.append(Task(task_id, _byte_count(task.get("bytes"), f"{key}.bytes")))
    return tuple(parsed)


def parse_profile(profile: Any) -> Profile:
    """Validate a profile dict (profile.json format); raise ConfigError naming the first bad key."""
    profile = _mapping(profile, "profile")
    nodes_by_graph: dict[tuple[int, bool], list[Node]] = {}
    graph_index: dict[tuple[int, bool], int] = {}
    for index, graph in enumerate(_sequence(profile.get("graphs"), "profile.graphs")):
        graph_key, nodes = _parse_graph(graph, f"profile.graphs[{index}]")
        _expect(graph_key not in nodes_by_graph, f"profile.graphs[{index}]",
                f"graph {graph_key[0]} (bwd {graph_key[1]}) listed twice")
        nodes_by_graph[graph_key], graph_index[graph_key] = nodes, index
    order = _parse_graph_order(profile.get("graph_order"), graph_index)
    nodes = tuple(node for graph in order for node in nodes_by_graph[graph])
    # Reloads can only go after backward nodes, and the step's end is measured from the last one.
    _expect(any(node.bwd for node in nodes), "profile.graphs", "no backward graph with nodes")
    if "device_total_bytes" in profile:
        _byte_count(profile["device_total_bytes"], "profile.device_total_bytes")
    return Profile(nodes, _parse_tasks(profile.get("tasks")))


def load_profile(path: str | Path) -> dict:
    """Read and validate profile.json; a missing, unreadable or malformed file is one ConfigError."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ConfigError("profile", f"cannot read {path}: {error.strerror or error}") from None
    try:
        profile = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError("profile", f"{path} is not valid JSON: {error}") from None
    parse_profile(profile)
    return profile


# ---------------------------------------------------------------- planning


def count_resident(tasks: tuple[Task, ...], budget_bytes: int, forward_peak_bytes: int) -> int:
    """Length of the task-list prefix that stays resident, sized against the forward peak.

    Stop at the first task that does not fit rather than skip it: the offloaded set is then always a suffix,
    so a larger budget offloads a subset of what a smaller one does (sweeps compare nested plans), and the
    resident states are the ones the optimizer step touches first, so the step can start on them while the
    offloaded tail is still coming back. Skipping would save less than one task's bytes.
    """
    headroom = budget_bytes - forward_peak_bytes
    for count, task in enumerate(tasks):
        if task.bytes > headroom:
            return count
        headroom -= task.bytes
    return len(tasks)


def place_reloads_asap(profile: Profile, offloaded: tuple[Task, ...], in_use_bytes: int, cap_bytes: int,
                       held_ids: frozenset[str] = frozenset()) -> list[tuple[int, Task]]:
    """(node position, task) pairs: each task reloaded after the earliest backward node from which every later
    node stays within the cap with it, or after the last node if none does. Task order is kept, so the optimizer
    step, which walks sub-groups in task order, gets its first offloaded sub-group back first. `in_use_bytes`
    is what is on the device during backward before any reload; a held task (never released) costs nothing."""
    bwd_positions = profile.bwd_positions
    later_peaks = _later_peaks([profile.nodes[position].peak_bytes for position in bwd_positions])
    pending, in_use, reloads = deque(offloaded), in_use_bytes, []

    def cost(task: Task) -> int:
        return 0 if task.id in held_ids else task.bytes

    # zip stops before the last node: whatever is still pending goes there, fitting or not.
    for position, later_peak in zip(bwd_positions, later_peaks):
        while pending and later_peak + in_use + cost(pending[0]) <= cap_bytes:
            task = pending.popleft()
            reloads.append((position, task))
            in_use += cost(task)
    reloads.extend((bwd_positions[-1], task) for task in pending)
    return reloads


def place_releases(profile: Profile, offloaded: tuple[Task, ...], resident_bytes: int,
                   cap_bytes: int) -> list[tuple[int, Task]]:
    """(forward node position, task) pairs for the ordered release policy: each task released right before the
    first forward node that would exceed the cap while it is still held (see the module docstring). Tasks not
    listed stay held through the step."""
    fwd_positions = [position for position, node in enumerate(profile.nodes) if not node.bwd]
    held, held_bytes, releases = deque(offloaded), sum(task.bytes for task in offloaded), []
    for index, position in enumerate(fwd_positions):
        need = profile.nodes[position].peak_bytes
        if index == len(fwd_positions) - 1:
            need = max(need, profile.floor_bytes)
        while held and need + resident_bytes + held_bytes > cap_bytes:
            task = held.popleft()
            releases.append((position, task))
            held_bytes -= task.bytes
    return releases


def _later_peaks(peaks: list[int]) -> list[int]:
    """For each node but the last, the max peak of the nodes after it."""
    later, running = [], 0
    for peak in reversed(peaks[1:]):
        running = max(running, peak)
        later.append(running)
    return later[::-1]


def predict_peak(profile: Profile, resident_bytes: int, offloaded: tuple[Task, ...],
                 releases: list[tuple[int, Task]], reloads: list[tuple[int, Task]]) -> int:
    """Walk the step in execution order with the releases and reloads applied; see the module docstring."""
    released = {task.id for _, task in releases}
    released_before: dict[int, int] = {}
    for position, task in releases:
        released_before[position] = released_before.get(position, 0) + task.bytes
    reloaded_after: dict[int, int] = {}
    for position, task in reloads:
        if task.id in released:  # a held task's reload only points the state back at its block
            reloaded_after[position] = reloaded_after.get(position, 0) + task.bytes
    in_use, peak = resident_bytes + sum(task.bytes for task in offloaded), 0
    for position, node in enumerate(profile.nodes):
        in_use -= released_before.get(position, 0)
        peak = max(peak, node.peak_bytes + in_use)
        in_use += reloaded_after.get(position, 0)
    last_peak = profile.nodes[profile.bwd_positions[-1]].peak_bytes
    return max(peak, last_peak + in_use)


def make_plan(profile: dict, budget_bytes: int, reload: str = "asap", release: str = "recorded",
              cap_bytes: int | None = None) -> dict:
    """The plan for one rank: which tasks to offload, where in forward to release their device blocks (ordered
    release only) and where in backward to reload them. `cap_bytes` defaults to the budget."""
    parsed = parse_profile(profile)
    _byte_count(budget_bytes, "offload.budget_bytes")
    cap_bytes = budget_bytes if cap_bytes is None else _byte_count(cap_bytes, "offload.peak_cap_bytes")
    _expect(reload in RELOAD_POLICIES, "offload.reload", f"must be one of {', '.join(RELOAD_POLICIES)}, got {reload!r}")
    _expect(release in RELEASE_POLICIES, "offload.release",
            f"must be one of {', '.join(RELEASE_POLICIES)}, got {release!r}")

    n_resident = count_resident(parsed.tasks, budget_bytes, parsed.forward_peak_bytes)
    resident, offloaded = parsed.tasks[:n_resident], parsed.tasks[n_resident:]
    resident_bytes = sum(task.bytes for task in resident)
    if release == "ordered":
        releases = place_releases(parsed, offloaded, resident_bytes, cap_bytes)
    else:  # recorded: every block goes back at the launch, before the first node
        releases = [(0, task) for task in offloaded]
    released = {task.id for _, task in releases}
    held = tuple(task for task in offloaded if task.id not in released)
    held_bytes = sum(task.bytes for task in held)
    if reload == "asap":
        reloads = place_reloads_asap(parsed, offloaded, resident_bytes + held_bytes, cap_bytes,
                                     frozenset(task.id for task in held))
    else:
        reloads = [(parsed.bwd_positions[-1], task) for task in offloaded]
    predicted_peak = predict_peak(parsed, resident_bytes, offloaded, releases, reloads)
    return {
        "budget_bytes": budget_bytes,
        "peak_cap_bytes": cap_bytes,
        "reload_policy": reload,
        "release_policy": release,
        "releases": [] if release == "recorded" else [
            {"task": task.id, "graph_id": parsed.nodes[position].graph_id, "bwd": False,
             "before_node": parsed.nodes[position].name} for position, task in releases],
        "held": [task.id for task in held],
        "offloaded": [task.id for task in offloaded],
        "offloaded_bytes": sum(task.bytes for task in offloaded),
        "resident_bytes": resident_bytes,
        "total_state_bytes": parsed.total_state_bytes,
        "reloads": [{"task": task.id, "graph_id": parsed.nodes[position].graph_id, "bwd": True,
                     "after_node": parsed.nodes[position].name} for position, task in reloads],
        "forward_peak_bytes": parsed.forward_peak_bytes,
        "floor_bytes": parsed.floor_bytes,
        "predicted_peak_bytes": predicted_peak,
        "feasible": predicted_peak <= budget_bytes,
    }


def plan_to_json(plan: dict) -> str:
    """Stable text for plan.json and the CLI: sorted keys, fixed indent."""
    return json.dumps(plan, sort_keys=True, indent=2)


# ---------------------------------------------------------------- CLI


class _OneLineParser(argparse.ArgumentParser):
    """Usage errors as one stderr line, exit 2, like ConfigErrors."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def _gb_to_bytes(value: float, key: str) -> int:
    _expect(math.isfinite(value) and value >= 0, key, f"must be a finite number >= 0, got {value}")
    return int(value * GB)


def _budget_from_args(args: argparse.Namespace) -> int:
    if args.budget_bytes is not None:
        return args.budget_bytes
    return _gb_to_bytes(args.budget_gb, "offload.budget_gb")


def main(argv: list[str] | None = None) -> int:
    parser = _OneLineParser(prog="python -m harness.offload.plan",
                            description="Print the offload plan for a memory profile and a budget as JSON.")
    parser.add_argument("--profile", required=True, help="profile.json of one rank")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--budget-gb", type=float, help="device memory budget in GB (1e9 bytes)")
    budget.add_argument("--budget-bytes", type=int, help="device memory budget in bytes")
    parser.add_argument("--reload", default="asap", help=f"reload policy: {' | '.join(RELOAD_POLICIES)}")
    parser.add_argument("--release", default="recorded", help=f"release policy: {' | '.join(RELEASE_POLICIES)}")
    parser.add_argument("--peak-cap-gb", type=float, default=None,
                        help="cap (GB) that releases and asap reloads are placed under; default: the budget")
    args = parser.parse_args(argv)
    try:
        cap = None if args.peak_cap_gb is None else _gb_to_bytes(args.peak_cap_gb, "offload.peak_cap_gb")
        plan = make_plan(load_profile(args.profile), _budget_from_args(args), args.reload, args.release, cap)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    print(plan_to_json(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
