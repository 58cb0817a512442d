"""Pure offload planner: memory profile + optimizer-state tasks + budget -> which states to offload, where to reload.

No torch, no CUDA: the DeepCompile pass builds the profile from DeepSpeed's profiling results and calls
`plan_offload(profile, budget_bytes, limit_bytes, ...)`; the same function runs offline as
`harness plan --profile profile.json --budget-gb X [--reload asap|at_end]` (plan_cli.py). A plan is a frozen `Plan`,
written and read as JSON in plan_record.py alone (`Plan.to_json`, `Plan.from_json`; plan.json through `PlanRecord`).

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
  - reclaimed: freed at the launch as recorded, so the walk below is recorded's; the releases are placed as
    ordered's, and there the host waits for the task's copy, so the allocator (which reuses a record_stream
    block only once the host sees its copy done) hands the block to the next request instead of mapping new
    memory, or, at the device limit, flushing its cache and retrying. The wait stalls the host only: the device
    has the forward up to that node queued.
- Reload placement and the walk below count what is on the device: R, the held tasks, and the reloaded ones.
  `cap` (default: the budget) is the limit both releases and asap reloads are placed under.
- The step's end: after the last backward node all states are back for the optimizer step. Its baseline is the
  forward's measured start where the profile has it (profile.py), else last_peak (what the last node held at
  most); the step adds step_transient on top of the states (measured on the steady step before planning, else
  one sub-group's fp32 gradient), so the end costs baseline + total_state_bytes + step_transient.
- predicted_peak = max( max over every node i in execution order, forward and backward, of
                        peak(i) + bytes(R) + bytes(held at i) + bytes(reloaded before i),
                        step end ).
- Calibration: a budget's plan is placed (R, releases, reloads) on the node peaks as profiled, as DeepSpeed's
  pass places them; its predicted_peak walks the same placement over the peaks calibrated to the running step
  (profile.calibrate: less what the profiler counts outside the allocator, less backward inputs already freed,
  plus the reduce buckets in backward, then moved together so the highest is the steady step's measured peak;
  with that measurement every backward node counts at the measured peak, whose place in backward is unknown).
- Gradient accumulation: the graphs run once per micro-batch, the states move once per optimizer step (out in the
  first micro-batch's forward, back in the last one's backward; runtime.py). The walk above is then the first
  micro-batch's forward and the last one's backward, the step's highest: the micro-batches between hold every
  offloaded state on the host and reload nothing. Backward carries the receive buffer DeepCompile adds for
  accumulated gradients (profile.calibrate); the gradients accumulate in ZeRO-3's partitions, which persist at any
  accumulation and are part of the step end's baseline.
- Device rule (plan_for_device): the longest resident prefix whose predicted_peak, placed and walked on the
  calibrated peaks under the cap = the limit, fits the limit; where none fits, the longest one that reaches the
  lowest predicted_peak of any prefix (reported infeasible). The limit is the device less the allocator overhead
  with no budget, and the lesser of that and the budget under `budget_rule=step_model` (a budget's plan by the
  step model instead of DeepSpeed's sizing: DeepSpeed's profile overstates the step, so at one budget this keeps
  more resident). With a measured peak it reloads during backward only what fits beside that peak; the rest
  comes back after backward, while the optimizer step works on the resident sub-groups, which it updates first.
- One budget with DeepCompile's prefetch and selective gather (`offload.compose`): what they hold (profile.json
  `prefetch_bytes`, `gathered_bytes`, measured on the GPU once they have run) is added to every forward and
  backward node, and selective gather's to the step end (profile.hold). Every rule above then plans on those
  peaks: the resident states fit (budget - held) and predicted_peak counts the held bytes. Nothing held: the plan
  is the one without composition.
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

import dataclasses
from collections import deque

from harness.offload.plan_record import Plan, PlanRecord, Release, Reload, plan_file_text, read_plan_file
from harness.offload.profile import Profile, Task, byte_count, expect, for_planning, parse_profile, read_profile
from harness.contract.schema import OffloadConfig, choices

__all__ = ["Plan", "PlanRecord", "Release", "Reload", "plan_file_text", "read_plan_file", "make_plan",
           "plan_for_device", "plan_within_budget", "plan_offload", "device_limit_bytes", "predict_peak"]

RELOAD_POLICIES = choices(OffloadConfig, "reload")
RELEASE_POLICIES = choices(OffloadConfig, "release")
# the policies whose releases sit at forward nodes (graph_pass): all but recorded, which frees every block at the launch
RELEASED_AT_SITES = tuple(policy for policy in RELEASE_POLICIES if policy != "recorded")
BUDGET_RULES = choices(OffloadConfig, "budget_rule")
DEFAULT_BUDGET_RULE = "step_model"  # conf/offload/default.yaml's; the CLI plans a budget as a run would


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
    return max(peak, profile.step_end_baseline_bytes + in_use + profile.step_transient_bytes)


def make_plan(profile: dict, budget_bytes: int, reload: str = "asap", release: str = "recorded",
              cap_bytes: int | None = None) -> Plan:
    """The plan for one rank: which tasks to offload, where in forward to release their device blocks (ordered
    and reclaimed release) and where in backward to reload them. `cap_bytes` defaults to the budget."""
    # Placed on the profile as read, as DeepSpeed's pass places (both offload comparable bytes at one budget);
    # the predicted peak comes from the step model calibrated to the running step.
    read = read_profile(profile)
    as_profiled, as_running = for_planning(read, calibrated=False), for_planning(read)
    byte_count(budget_bytes, "offload.budget_bytes")
    cap_bytes = budget_bytes if cap_bytes is None else byte_count(cap_bytes, "offload.peak_cap_bytes")
    _check_policies(reload, release)
    n_resident = count_resident(as_profiled.tasks, budget_bytes, as_profiled.forward_peak_bytes)
    plan = _plan_keeping(as_profiled, n_resident, cap_bytes, reload, release, predict_on=as_running)
    return dataclasses.replace(plan, budget_bytes=budget_bytes, feasible=plan.predicted_peak_bytes <= budget_bytes,
                               rule="budget")


def plan_for_device(profile: dict, limit_bytes: int, reload: str = "asap", release: str = "recorded") -> Plan:
    """The auto rule at a device limit: the plan that offloads the least (keeps the longest prefix of the task list
    resident) whose predicted peak fits `limit_bytes` (the device size less the allocator's overhead). When no plan
    fits, it is reported infeasible and offloads the least that reaches the lowest peak any plan reaches: past that,
    offloading more only adds copies (on wide_2l at 11 GB the optimizer step alone, every state back, holds 12.29
    GB). The limit is also the cap reloads and releases are placed under."""
    parsed = parse_profile(profile)
    byte_count(limit_bytes, "offload.limit_bytes")
    _check_policies(reload, release)
    over = []  # the plans that do not fit, least offload first
    for n_resident in range(len(parsed.tasks), -1, -1):
        plan = _plan_keeping(parsed, n_resident, limit_bytes, reload, release)
        if plan.predicted_peak_bytes <= limit_bytes:
            break
        over.append(plan)
    else:
        lowest = min(candidate.predicted_peak_bytes for candidate in over)
        plan = next(candidate for candidate in over if candidate.predicted_peak_bytes == lowest)
    return dataclasses.replace(plan, budget_bytes=limit_bytes, feasible=plan.predicted_peak_bytes <= limit_bytes,
                               rule="device_limit")


def plan_within_budget(profile: dict, budget_bytes: int, limit_bytes: int, reload: str = "asap",
                       release: str = "recorded") -> Plan:
    """`budget_rule=step_model`: the device rule under the lesser of the budget and the device limit; the plan's
    budget_bytes is that lesser one, the peak it was made to fit."""
    byte_count(budget_bytes, "offload.budget_bytes")
    return dataclasses.replace(plan_for_device(profile, min(budget_bytes, limit_bytes), reload, release),
                               rule="step_model")


def plan_offload(profile: dict, budget_bytes: int | None, limit_bytes: int | None, budget_rule: str = "deepspeed",
                 reload: str = "asap", release: str = "recorded", cap_bytes: int | None = None) -> Plan:
    """The plan our pass makes, online and offline: no budget, the device rule at `limit_bytes` (the device less the
    allocator overhead); a budget, DeepSpeed's sizing (make_plan, under `cap_bytes`) or, under
    `budget_rule=step_model`, the device rule under the lesser of the budget and the limit (None: the budget)."""
    expect(budget_rule in BUDGET_RULES, "offload.budget_rule",
           f"must be one of {', '.join(BUDGET_RULES)}, got {budget_rule!r}")
    if budget_bytes is None:
        return plan_for_device(profile, limit_bytes, reload, release)
    if budget_rule == "deepspeed":
        return make_plan(profile, budget_bytes, reload, release, cap_bytes)
    return plan_within_budget(profile, budget_bytes, budget_bytes if limit_bytes is None else limit_bytes, reload,
                              release)


def device_limit_bytes(device_bytes: int, overhead_bytes: int | None) -> int:
    """What the step may allocate on a device of this size: the size less what the allocator holds beyond the live
    bytes on this run (`overhead_bytes`: reserved less allocated once the cache is emptied at the planning step:
    blocks of other streams, partly used segments); none measured: the size itself."""
    return max(0, device_bytes - (overhead_bytes or 0))


def _check_policies(reload: str, release: str) -> None:
    expect(reload in RELOAD_POLICIES, "offload.reload", f"must be one of {', '.join(RELOAD_POLICIES)}, got {reload!r}")
    expect(release in RELEASE_POLICIES, "offload.release",
           f"must be one of {', '.join(RELEASE_POLICIES)}, got {release!r}")


def _plan_keeping(parsed: Profile, n_resident: int, cap_bytes: int, reload: str, release: str,
                  predict_on: Profile | None = None) -> Plan:
    """The plan that keeps the first `n_resident` tasks resident (the budget keys are the caller's); its peak is
    predicted on `predict_on` (the same graphs, calibrated), default the profile it was placed on."""
    resident, offloaded = parsed.tasks[:n_resident], parsed.tasks[n_resident:]
    resident_bytes = sum(task.bytes for task in resident)
    # where the forward first needs a task's block back: ordered frees it there, reclaimed waits there for its copy
    releases = place_releases(parsed, offloaded, resident_bytes, cap_bytes) if release in RELEASED_AT_SITES else []
    # when each block goes back to the allocator: recorded and reclaimed at the launch, before the first node
    freed = releases if release == "ordered" else [(0, task) for task in offloaded]
    released = {task.id for _, task in freed}
    held = tuple(task for task in offloaded if task.id not in released)
    held_bytes = sum(task.bytes for task in held)
    if reload == "asap":
        reloads = place_reloads_asap(parsed, offloaded, resident_bytes + held_bytes, cap_bytes,
                                     frozenset(task.id for task in held))
    else:
        reloads = [(parsed.bwd_positions[-1], task) for task in offloaded]
    predicted_peak = predict_peak(predict_on or parsed, resident_bytes, offloaded, freed, reloads)
    return Plan(
        peak_cap_bytes=cap_bytes, reload_policy=reload, release_policy=release,
        releases=[Release(task.id, parsed.nodes[position].graph_id, False, parsed.nodes[position].name)
                  for position, task in releases],
        held=[task.id for task in held],
        offloaded=[task.id for task in offloaded],
        offloaded_bytes=sum(task.bytes for task in offloaded),
        resident_bytes=resident_bytes,
        total_state_bytes=parsed.total_state_bytes,
        reloads=[Reload(task.id, parsed.nodes[position].graph_id, True, parsed.nodes[position].name)
                 for position, task in reloads],
        forward_peak_bytes=parsed.forward_peak_bytes,
        floor_bytes=parsed.floor_bytes,
        outside_bytes=parsed.outside_bytes,
        predicted_peak_bytes=predicted_peak,
        feasible=predicted_peak <= cap_bytes,
        **({"prefetch_bytes": parsed.prefetch_bytes, "gathered_bytes": parsed.gathered_bytes}
           if parsed.held_bytes else {}),  # plans without composition keep their keys
    )


if __name__ == "__main__":  # `python -m harness.offload.plan`, as before the CLI had its own module
    import sys

    from harness.offload.plan_cli import main

    sys.exit(main())
