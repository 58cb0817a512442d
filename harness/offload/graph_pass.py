"""The DeepCompile passes: evict every optimizer state, then plan against the emptied profile and insert our ops.

Both are DeepCompile passes, `(gm, graph_id, graph_order, profiling_results, create_inputs_fn, mem_budget,
param_manager, bwd)`, run once per graph at the step where a schedule entry starts a phase (schedule.py).

- evict (first forward graph only): take every state off the device and wait, so the profiling that follows
  (the ZeRO-3 gather/release pass re-profiles its graph) measures the step without any state resident.
- plan, forward: record the graph's memory profile. The first forward graph gets, before its first compute
  node, the empty-cache op and one launch op naming every task; the launch op offloads at run time only the
  tasks the plan offloads, because the plan needs the backward profile, which exists only once backward is
  compiled. Later forward graphs (graph breaks) get nothing: all offloads start at the head of the step.
- plan, forward, release=ordered or reclaimed: also up to graph_edit.RELEASE_SITES release ops, evenly spaced, each
  before a node. Which states each one frees (ordered) or waits for (reclaimed) is decided with the plan (the
  planner names a node per state; the state goes to the last site at or before it, so it is freed no later than
  planned).
- before_compose (`offload.compose` only; right after gather/release, before DeepCompile's prefetch and selective
  gather): keep the graph's profile and the allocator's reading as they are without those passes. The plan pass,
  after them, plans on the kept readings (the step measured before planning ran without them, and profile.calibrate
  anchors to it) and records what they hold: `prefetch_bytes`, the most prefetch raised a graph's profiled peak, and
  `gathered_bytes`, what the allocator gained across selective gather, which allocates the buffers of the
  parameters it keeps gathered when it runs (on the last backward graph). The planner counts both (profile.hold).
- plan, backward: record the profile, call the planner (plan.py) on everything recorded so far, and insert this
  graph's reloads. The last backward graph (the first forward graph's) also gets the end-of-backward op; its
  plan, made from the complete profile, is final: it arms the runtime and is written to the run dir.
  An earlier backward graph (graph breaks) inserts only the reloads the plan places inside it, so each task is
  reloaded once; whatever the final plan offloads without a reload op yet is reloaded at the end.

Anchors and op placement: graph_edit.py. The profile's format: profiling.py and profile.py.

Both passes change the graph in place and return None, so DeepCompile does not re-profile the graph for them
(our ops must not shape the profile, and re-profiling a whole graph costs seconds of compile time).
"""
from __future__ import annotations

import logging
import os
from typing import Callable

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx import Graph, GraphModule

from harness.contract import runfiles
from harness.offload import ops
from harness.offload.graph_edit import (insert_end_backward, insert_head_ops, insert_release_sites, insert_reloads,
                                        profiled_node_names, release_site_names, strip_offload_ops)
from harness.offload.profile_builder import ProfileBuilder, graph_nodes_profile, memory_records, readings_before
from harness.offload.plan import RELEASED_AT_SITES, device_limit_bytes, plan_offload
from harness.offload.plan_record import Plan, PlanRecord, plan_file_text
from harness.contract.errors import PlanRefused
from harness.offload.runtime import OffloadRuntime
from harness.offload.states import discover_tasks
from harness.contract.units import GB

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------- run-dir files


class PlanFiles:
    """profile.json (the latest profile, the planner CLI's input) and plan.json: the plan itself, or, once a
    run has planned in more than one phase, an object keyed by phase number."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self._plans: dict[int, PlanRecord] = {}

    def write(self, profile: dict, record: PlanRecord) -> None:
        os.makedirs(self.run_dir, exist_ok=True)
        self._plans[record.phase] = record
        runfiles.write_json(os.path.join(self.run_dir, runfiles.PROFILE), profile)
        runfiles.write_atomic(os.path.join(self.run_dir, runfiles.PLAN), plan_file_text(self._plans))


# ---------------------------------------------------------------- the passes


def _is_rank0() -> bool:
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


class OffloadPass:
    """State of our passes across the graphs of one phase. `evict` and `plan` are the registered pass functions.
    `budget_bytes` None: the auto rule at the device limit (plan.plan_for_device) instead of a budget;
    `budget_rule` how a budget is planned: "deepspeed" (plan.make_plan) or "step_model" (plan.plan_within_budget);
    plan.plan_offload picks."""

    def __init__(self, runtime: OffloadRuntime, zero_optimizer, budget_bytes: int | None, reload_policy: str,
                 files: PlanFiles, device_total_bytes: int, current_phase: Callable[[], int],
                 writes_files: Callable[[], bool] = _is_rank0, release_policy: str = "recorded",
                 cap_bytes: int | None = None, reduce_buckets: tuple[int, int] = (0, 0),
                 budget_rule: str = "deepspeed", accumulation_recv_bytes: int = 0, compose: str = "none",
                 if_infeasible: str = "run"):
        self.runtime = runtime
        self.zero_optimizer = zero_optimizer
        self.budget_bytes = budget_bytes
        self.budget_rule = budget_rule
        self.by_step_model = budget_bytes is None or budget_rule == "step_model"  # planned to fit the device limit
        self.reload_policy = reload_policy
        self.release_policy = release_policy
        self.cap_bytes = cap_bytes
        self.files = files
        self.device_total_bytes = device_total_bytes
        self.current_phase = current_phase
        self.writes_files = writes_files
        self._builder: ProfileBuilder | None = None
        self._placements: dict[int, list[dict]] = {}  # backward graph -> where its reload ops went
        self._release_sites: dict[int, list[str]] = {}  # forward graph (profile index) -> node names with a site
        self.last_plan: Plan | None = None   # the last final plan (made at the last backward graph)
        self._overhead_bytes: int | None = None  # reserved less allocated after the planning step's eviction
        self.reduce_buckets = reduce_buckets  # (all, the largest one), bytes
        self.accumulation_recv_bytes = accumulation_recv_bytes  # backward's extra with gradient accumulation
        self._steady_step: dict | None = None  # the last steady step's record before the first plan
        self.if_infeasible = if_infeasible  # "refuse": a plan over its budget stops the point (PlanRefused)
        self.compose = compose  # DeepCompile's passes between before_compose and plan (schedule.COMPOSED_PASSES)
        # (graph, bwd) -> records, complete, allocated
        self._before: dict[tuple[int, bool], tuple[list, bool, int]] = {}
        self._held = {"prefetch_bytes": 0, "gathered_bytes": 0}  # this phase's, measured across the composed passes
        self.pass_seconds = 0.0  # in evict, before_compose and plan (schedule.register_passes times them)

    def evict(self, gm: GraphModule, graph_id: int, graph_order, profiling_results, create_inputs_fn,
              mem_budget, param_manager, bwd: bool) -> None:
        if bwd or not graph_order or graph_order[0][0] != graph_id:
            return None
        self.runtime.adopt(discover_tasks(self.zero_optimizer))
        with unset_fake_temporarily():  # compilers call passes under a fake mode; these copies are real
            moved = self.runtime.evict_all()
            if self.by_step_model:  # the device limit counts what the allocator holds beyond live bytes
                self._overhead_bytes = self.runtime.allocator_overhead_bytes()
        logger.info("offload: evicted %d optimizer states (%.2f GB) before profiling", len(self.runtime.slots),
                    moved / GB)
        return None

    def before_compose(self, gm: GraphModule, graph_id: int, graph_order, profiling_results, create_inputs_fn,
                       mem_budget, param_manager, bwd: bool) -> None:
        mem, complete = memory_records(profiling_results, graph_id, bwd)
        self._before[(graph_id, bwd)] = (mem, complete, self.runtime.mover.device.allocated_bytes())
        return None

    def plan(self, gm: GraphModule, graph_id: int, graph_order, profiling_results, create_inputs_fn,
             mem_budget, param_manager, bwd: bool) -> None:
        graph = gm.graph
        strip_offload_ops(graph)
        if graph_id not in [gid for gid, _ in graph_order]:
            logger.warning("offload: graph %d is not in DeepCompile's graph order (a recompile?); "
                           "it gets no offload ops", graph_id)
        elif bwd:
            self._plan_backward(graph, graph_id, graph_order, profiling_results)
        else:
            self._plan_forward(graph, graph_id, graph_order, profiling_results)
        graph.lint()
        gm.recompile()
        return None

    def _record(self, graph: Graph, graph_id: int, profiling_results, bwd: bool) -> None:
        mem, complete = memory_records(profiling_results, graph_id, bwd)
        before = self._before.pop((graph_id, bwd), None)
        if before is not None:
            mem, complete = self._without_composed(graph, mem, complete, before)
        nodes, complete = graph_nodes_profile(graph, mem, complete, self.device_total_bytes, bwd)
        if not complete:
            logger.warning("offload: no complete memory profile for graph %d (bwd=%s); planning as if it used "
                           "the whole device", graph_id, bwd)
        # the first record is an input's: the profiler's reading before the graph allocates anything
        self._builder.add(graph_id, bwd, nodes, complete, int(mem[0][1]) if complete else None)

    def _without_composed(self, graph: Graph, mem: list, complete: bool, before: tuple[list, bool, int]):
        """The graph's readings without the composed passes, and what they hold added to this phase's count. Selective
        gather's buffers were allocated before DeepCompile re-profiled the graph, so they are in its readings too:
        they come off the rise before it counts as prefetch's."""
        before_mem, before_complete, allocated = before
        gathered = 0
        if "selective_gather" in self.compose:
            gathered = max(0, self.runtime.mover.device.allocated_bytes() - allocated)
        self._held["gathered_bytes"] += gathered
        if complete and before_complete and mem and before_mem:
            rise = max(record[3] for record in mem) - max(record[3] for record in before_mem) - gathered
            self._held["prefetch_bytes"] = max(self._held["prefetch_bytes"], rise)
        return readings_before(profiled_node_names(graph), before_mem), before_complete

    def _start_phase(self) -> None:
        self.runtime.adopt(discover_tasks(self.zero_optimizer))
        self.runtime.begin_phase()
        tasks = [{"id": slot.task.id, "bytes": slot.task.nbytes} for slot in self.runtime.slots.values()]
        self._builder = ProfileBuilder(tasks, self.device_total_bytes)
        self._placements = {}
        self._release_sites = {}
        self._held = {"prefetch_bytes": 0, "gathered_bytes": 0}

    def _plan_forward(self, graph: Graph, graph_id: int, graph_order, profiling_results) -> None:
        first = graph_id == graph_order[0][0]
        if first or self._builder is None:
            self._start_phase()
        self._record(graph, graph_id, profiling_results, bwd=False)
        if first:
            task_ids = tuple(self.runtime.slots)
            insert_head_ops(graph, [(ops.EMPTY_CACHE, ops.REGISTRY.add(ops.EMPTY_CACHE)),
                                    (ops.LAUNCH, ops.REGISTRY.add(ops.LAUNCH, task_ids))])
        if self.release_policy in RELEASED_AT_SITES:
            index = self._builder.index(graph_id)
            names = release_site_names(profiled_node_names(graph))
            self._release_sites[index] = names
            insert_release_sites(graph, [(ops.REGISTRY.add(ops.RELEASE, site=f"{index}:{name}"), name)
                                         for name in names])

    def _plan_backward(self, graph: Graph, graph_id: int, graph_order, profiling_results) -> None:
        if self._builder is None:
            self._start_phase()
        self._record(graph, graph_id, profiling_results, bwd=True)
        with_backward = [gid for gid, needs_backward in graph_order if needs_backward]
        is_last = not with_backward or graph_id == with_backward[0]
        self._builder.step_facts.update(self._step_facts())
        profile = self._builder.to_dict()
        limit = device_limit_bytes(self.device_total_bytes, profile.get("allocator_overhead_bytes"))
        plan = plan_offload(profile, self.budget_bytes, limit, self.budget_rule, self.reload_policy,
                            self.release_policy, self.cap_bytes)
        self._placements.pop(graph_id, None)  # this graph's ops were stripped: its reloads are placed anew
        reloads = self._reloads_here(plan, graph_id, is_last)
        entries = [(ops.REGISTRY.add(ops.RELOAD, (task,)), task, after) for task, after in reloads]
        index = self._builder.index(graph_id)
        self._placements[graph_id] = [{"graph_id": index, **placement}
                                      for placement in insert_reloads(graph, entries)]
        if is_last:
            insert_end_backward(graph, ops.REGISTRY.add(ops.END_BACKWARD))
            self._finish(plan)

    def observe_step(self, record: dict) -> None:
        """Keep the last steady step (not a compile step) before the first plan: the step model's measurements."""
        if self.last_plan is None and record.get("phase_step", 0) >= 1:
            self._steady_step = record

    def _step_facts(self) -> dict:
        """What the profile alone gets wrong about the step as it runs (profile.py)."""
        masters = self.zero_optimizer.fp32_partitioned_groups_flat
        facts = {"measured_start_bytes": self.runtime.forward_start_bytes,
                 "step_transient_bytes": max((flat.numel() * flat.element_size() for flat in masters), default=0),
                 "reduce_bucket_bytes": self.reduce_buckets[0],
                 "allocator_overhead_bytes": self._device_rule_overhead()}
        if self.accumulation_recv_bytes:  # profile.json without accumulation stays as it was
            facts["accumulation_recv_bytes"] = self.accumulation_recv_bytes
        if self.compose != "none":  # and without composition
            facts.update(self._held)
        return {**facts, **self._measured_step(facts["measured_start_bytes"])}

    def _device_rule_overhead(self) -> int | None:
        """What the device rule keeps free: what the allocator holds beyond the live bytes once the cache is emptied,
        plus room for the step's largest single request (a reduce bucket or a state), which must fit in one
        segment: near the limit, free memory is scattered over segments. (The running step's reserved less
        allocated is no guide: with room to spare the allocator caches freely, gigabytes more than it needs.)"""
        if self._overhead_bytes is None:
            return None
        largest_state = max((slot.task.nbytes for slot in self.runtime.slots.values()), default=0)
        return self._overhead_bytes + max(self.reduce_buckets[1], largest_state)

    def _measured_step(self, baseline_bytes: int | None) -> dict:
        """From the steady step before planning: forward + backward's peak less the states then on the device, and
        what its optimizer step allocated beyond the baseline and the states it held at once. States are out of the
        device until the first plan (evict_from=start: each sub-group's come in for its own update), or all in."""
        step = self._steady_step
        if step is None or step.get("fwd_bwd_peak_allocated_bytes") is None or baseline_bytes is None:
            return {}
        by_sub_group: dict[int, int] = {}
        for slot in self.runtime.slots.values():
            by_sub_group[slot.task.sub_group] = by_sub_group.get(slot.task.sub_group, 0) + slot.task.nbytes
        total = sum(by_sub_group.values())
        out_until_plan = self.runtime.out_until_plan
        facts = {"measured_fwd_bwd_peak_bytes": step["fwd_bwd_peak_allocated_bytes"] - (0 if out_until_plan else total)}
        if step.get("opt_step_peak_allocated_bytes") is not None:
            held = max(by_sub_group.values(), default=0) if out_until_plan else total
            facts["step_transient_bytes"] = max(0, step["opt_step_peak_allocated_bytes"] - baseline_bytes - held)
        return facts

    def _reloads_here(self, plan: Plan, graph_id: int, is_last: bool) -> list[tuple[str, str | None]]:
        """(task, after-node) reloads for this graph. Before the last backward graph, a reload the plan puts
        after this graph's last node only means "not yet" (the planner has not seen the later graphs)."""
        index, last_node = self._builder.index(graph_id), self._builder.last_node(graph_id, bwd=True)
        elsewhere = {placement["task"] for placements in self._placements.values() for placement in placements}
        chosen = [(reload.task, reload.after_node) for reload in plan.reloads
                  if reload.graph_id == index and reload.task not in elsewhere
                  and (is_last or reload.after_node != last_node)]
        if is_last:
            placed = elsewhere | {task for task, _ in chosen}
            chosen += [(task, None) for task in plan.offloaded if task not in placed]
        return chosen

    def _sites_of_releases(self, plan: Plan) -> dict[str, tuple[str, ...]]:
        """Release op site -> the states it frees: for each planned release, the last site at or before the node
        the planner named, in that forward graph."""
        chosen: dict[str, list[str]] = {}
        for release in plan.releases:
            graph = release.graph_id
            position = {node["name"]: index for index, node in enumerate(self._builder.nodes(graph, bwd=False))}
            limit = position[release.before_node]
            earlier = [name for name in self._release_sites.get(graph, []) if position[name] <= limit]
            if not earlier:  # a forward graph compiled without sites: the state stays held until its reload
                continue
            chosen.setdefault(f"{graph}:{max(earlier, key=position.get)}", []).append(release.task)
        return {site: tuple(tasks) for site, tasks in chosen.items()}

    def _finish(self, plan: Plan) -> None:
        release_sites = self._sites_of_releases(plan)
        self.runtime.finalize_plan(plan.offloaded, release_sites)
        self.last_plan = plan
        phase = self.current_phase()
        placements = [placement for graph in self._placements.values() for placement in graph]
        record = PlanRecord(plan, phase, self._builder.complete, placements,
                            {site: list(tasks) for site, tasks in release_sites.items()})
        if self.writes_files():
            self.files.write(self._builder.to_dict(), record)
            # one line in the worker log: the fact a reader of a run needs first
            logger.info(f"offload: phase {phase} plan: {len(plan.offloaded)} of {len(self.runtime.slots)} states "
                        f"offloaded ({plan.offloaded_bytes / GB:.2f} of {plan.total_state_bytes / GB:.2f} GB), "
                        f"{len(placements)} reload ops, predicted peak {plan.predicted_peak_bytes / GB:.2f} GB, "
                        f"budget {plan.budget_bytes / GB:.2f} GB, feasible={plan.feasible}")
        if self.if_infeasible == "refuse" and plan.feasible is False:  # plan.json says what was refused
            raise PlanRefused(plan.predicted_peak_bytes, plan.budget_bytes, phase)
