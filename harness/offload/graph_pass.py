"""The DeepCompile passes: evict every optimizer state, then plan against the emptied profile and insert our ops.

Both are DeepCompile passes, `(gm, graph_id, graph_order, profiling_results, create_inputs_fn, mem_budget,
param_manager, bwd)`, run once per graph at the step where a schedule entry starts a phase (schedule.py).

- evict (first forward graph only): take every state off the device and wait, so the profiling that follows
  (the ZeRO-3 gather/release pass re-profiles its graph) measures the step without any state resident.
- plan, forward: record the graph's memory profile. The first forward graph gets, before its first compute
  node, the empty-cache op and one launch op naming every task; the launch op offloads at run time only the
  tasks the plan offloads, because the plan needs the backward profile, which exists only once backward is
  compiled. Later forward graphs (graph breaks) get nothing: all offloads start at the head of the step.
- plan, forward, release=ordered: also up to RELEASE_SITES release ops, evenly spaced, each before a node. Which
  states each one frees is decided with the plan (the planner names a node per state; the state goes to the
  last site at or before it, so it is freed no later than planned).
- plan, backward: record the profile, call the planner (plan.py) on everything recorded so far, and insert this
  graph's reloads. The last backward graph (the first forward graph's) also gets the end-of-backward op; its
  plan, made from the complete profile, is final: it arms the runtime and is written to the run dir.
  An earlier backward graph (graph breaks) inserts only the reloads the plan places inside it, so each task is
  reloaded once; whatever the final plan offloads without a reload op yet is reloaded at the end.

Anchors: the graph passes each op a tensor to depend on, and the op runs after whatever produced it. A reload
is anchored on the first suitable tensor at or after the node the plan puts it after, never on a graph input or
a view of one (inductor could schedule it before any compute). Suitable, in order of preference:
1. the output of a DeepSpeed barrier op (`dc::reduce_grad`, issued right after each gradient is computed): an
   extern kernel's fresh, empty output, so reading it changes nothing in how inductor fuses or rounds compute;
2. otherwise (graphs without them) the output of an aten computation. Reading it forces inductor to keep that
   value in memory, which can change fusion and bf16 rounding slightly; hence only the fallback.
Launch and empty-cache ops are anchored on a graph input on purpose: they belong at the very start.

Both passes change the graph in place and return None, so DeepCompile does not re-profile the graph for them
(our ops must not shape the profile, and re-profiling a whole graph costs seconds of compile time).
"""
from __future__ import annotations

import logging
import operator
import os
from typing import Callable, Iterable

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx import Graph, GraphModule, Node
from torch.fx.passes.shape_prop import TensorMetadata

from harness import runfiles
from harness.offload import ops
from harness.offload.plan import device_limit_bytes, make_plan, plan_for_device, plan_to_json
from harness.offload.runtime import OffloadRuntime
from harness.offload.states import discover_tasks

logger = logging.getLogger(__name__)

_COMPUTE_NAMESPACES = ("aten", "prims")
RELEASE_SITES = 32  # per forward graph: fine enough to track the forward's memory growth, cheap per step
PREFERRED_ANCHOR_OPS = frozenset({"dc::reduce_grad"})


# ---------------------------------------------------------------- FX helpers


def _yields_tensor(node: Node) -> bool:
    if "val" in node.meta:
        return isinstance(node.meta["val"], torch.Tensor)
    if "tensor_meta" in node.meta:
        return isinstance(node.meta["tensor_meta"], TensorMetadata)
    if isinstance(node.target, torch._ops.OpOverload):
        returns = node.target._schema.returns
        return len(returns) == 1 and isinstance(returns[0].type, torch.TensorType)
    return False


def _is_compute_op(node: Node) -> bool:
    """An aten/prims computation on graph values that returns fresh memory (not a view, not a factory)."""
    target = node.target
    return (node.op == "call_function" and isinstance(target, torch._ops.OpOverload)
            and target.namespace in _COMPUTE_NAMESPACES
            and not any(ret.alias_info is not None for ret in target._schema.returns)
            and len(node.all_input_nodes) > 0)


def is_compute_anchor(node: Node) -> bool:
    """A tensor that exists only once a computation has run, so an op reading it runs after that computation."""
    if node.op == "call_function" and node.target is operator.getitem:
        source = node.args[0]
        return isinstance(source, Node) and _is_compute_op(source) and _yields_tensor(node)
    return _is_compute_op(node) and _yields_tensor(node)


def _tensor_input(graph: Graph) -> Node:
    for node in graph.nodes:
        if node.op == "placeholder" and _yields_tensor(node):
            return node
    raise ValueError("graph has no tensor input to anchor the offload ops on")


def _output_node(graph: Graph) -> Node:
    return next(node for node in graph.nodes if node.op == "output")


def _create_op(graph: Graph, kind: str, anchor: Node, idx: int) -> Node:
    node = graph.call_function(ops.op(kind), (anchor, idx))
    node.meta["val"] = None  # the ops return nothing
    return node


def profiled_node_names(graph: Graph) -> list[str]:
    """The nodes a plan may name: every node but inputs, the output and our own ops, in graph order."""
    return [node.name for node in graph.nodes
            if node.op not in ("placeholder", "output") and not ops.is_offload_op(node)]


def strip_offload_ops(graph: Graph) -> int:
    """Remove our ops (a graph handed to the pass again must not get them twice). Returns how many."""
    ours = [node for node in graph.nodes if ops.is_offload_op(node)]
    for node in ours:
        graph.erase_node(node)
    return len(ours)


def insert_head_ops(graph: Graph, entries: Iterable[tuple[str, int]]) -> list[Node]:
    """(kind, registry index) ops, in order, before the first non-input node, anchored on a graph input."""
    anchor = _tensor_input(graph)
    first = next(node for node in graph.nodes if node.op != "placeholder")
    created = []
    for kind, idx in entries:
        with graph.inserting_before(first):
            created.append(_create_op(graph, kind, anchor, idx))
    return created


def _is_preferred_anchor(node: Node, preferred: frozenset[str]) -> bool:
    return node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) \
        and node.target._name in preferred


def _anchor_at_or_after(nodes: list[Node], position: int, preferred: frozenset[str]) -> Node | None:
    body = [node for node in nodes[position:] if node.op != "output"]
    return next((node for node in body if _is_preferred_anchor(node, preferred)),
                next((node for node in body if is_compute_anchor(node)), None))


def _last_anchor(nodes: list[Node], before: int, preferred: frozenset[str]) -> Node | None:
    body = list(reversed(nodes[:before]))
    return next((node for node in body if _is_preferred_anchor(node, preferred)),
                next((node for node in body if is_compute_anchor(node)), None))


def insert_reloads(graph: Graph, reloads: list[tuple[int, str, str | None]],
                   preferred: frozenset[str] = PREFERRED_ANCHOR_OPS) -> list[dict]:
    """Insert (registry index, task id, after-node name or None for "at the end") reload ops, keeping the list's
    order among ops that land at the same place. Returns where each went: task, after_node, anchor."""
    nodes = list(graph.nodes)
    position = {node.name: index for index, node in enumerate(nodes)}
    output = _output_node(graph)
    last_inserted: dict[Node, Node] = {}  # insertion point -> the op last inserted there
    placements = []
    for idx, task_id, after_name in reloads:
        if after_name is None or after_name not in position:
            anchor = _last_anchor(nodes, len(nodes), preferred) or _tensor_input(graph)
            point = None
        else:
            after = position[after_name]
            anchor = _anchor_at_or_after(nodes, after, preferred)
            if anchor is None:  # nothing computes after it: the reload belongs at the end of the graph
                anchor, point = _last_anchor(nodes, after + 1, preferred) or _tensor_input(graph), None
            else:
                point = anchor
        if point is None:
            with graph.inserting_before(output):
                _create_op(graph, ops.RELOAD, anchor, idx)
        else:
            with graph.inserting_after(last_inserted.get(point, point)):
                last_inserted[point] = _create_op(graph, ops.RELOAD, anchor, idx)
        placements.append({"task": task_id, "after_node": after_name, "anchor": anchor.name})
    return placements


def release_site_names(names: list[str], count: int = RELEASE_SITES) -> list[str]:
    """Up to `count` node names, evenly spaced over `names` (profiled order), the first always included."""
    if not names:
        return []
    step = max(1, len(names) / count)
    return list(dict.fromkeys(names[int(k * step)] for k in range(min(count, len(names)))))


def insert_release_sites(graph: Graph, sites: list[tuple[int, str]],
                         preferred: frozenset[str] = PREFERRED_ANCHOR_OPS) -> None:
    """(registry index, node name) release ops, each right before its node and anchored on the last suitable
    tensor before it (on a graph input at the head): the op may run early, never after its node."""
    nodes = list(graph.nodes)
    position = {node.name: index for index, node in enumerate(nodes)}
    for idx, name in sites:
        anchor = _last_anchor(nodes, position[name], preferred) or _tensor_input(graph)
        with graph.inserting_before(nodes[position[name]]):
            _create_op(graph, ops.RELEASE, anchor, idx)


def insert_end_backward(graph: Graph, idx: int, preferred: frozenset[str] = PREFERRED_ANCHOR_OPS) -> Node:
    """The end-of-backward op, after every other node (so after every reload) and right before the output."""
    nodes = list(graph.nodes)
    anchor = _last_anchor(nodes, len(nodes), preferred) or _tensor_input(graph)
    with graph.inserting_before(_output_node(graph)):
        return _create_op(graph, ops.END_BACKWARD, anchor, idx)


# ---------------------------------------------------------------- the profile


class ProfileBuilder:
    """Accumulates one phase's graphs into the planner's profile format (DESIGN.md). Graph ids in the profile are
    indices in forward order; DeepCompile's ids (object ids) are kept only here."""

    def __init__(self, tasks: list[dict], device_total_bytes: int, step_facts: dict | None = None):
        self.tasks = tasks
        self.device_total_bytes = device_total_bytes
        self.step_facts = step_facts or {}  # measured_start_bytes, step_transient_bytes, allocator_overhead_bytes
        self._fwd_order: list[int] = []
        self._bwd_order: list[int] = []
        self._graphs: dict[tuple[int, bool], dict] = {}

    def add(self, graph_id: int, bwd: bool, nodes: list[dict], complete: bool, start_alloc: int | None = None) -> None:
        order = self._bwd_order if bwd else self._fwd_order
        if graph_id not in order:
            order.append(graph_id)
        if graph_id not in self._fwd_order:  # a backward graph whose forward we never saw
            self._fwd_order.append(graph_id)
        graph = {"nodes": nodes, "complete": complete}
        if start_alloc is not None:
            graph["start_alloc_bytes"] = start_alloc
        self._graphs[(graph_id, bwd)] = graph

    def index(self, graph_id: int) -> int:
        return self._fwd_order.index(graph_id)

    def nodes(self, index: int, bwd: bool) -> list[dict]:
        """The recorded nodes of the graph with this profile index."""
        return self._graphs[(self._fwd_order[index], bwd)]["nodes"]

    def last_node(self, graph_id: int, bwd: bool) -> str | None:
        nodes = self._graphs[(graph_id, bwd)]["nodes"]
        return nodes[-1]["name"] if nodes else None

    @property
    def complete(self) -> bool:
        return all(graph["complete"] for graph in self._graphs.values())

    def to_dict(self) -> dict:
        keys = [(gid, False) for gid in self._fwd_order if (gid, False) in self._graphs] + \
               [(gid, True) for gid in self._bwd_order]
        return {
            "graph_order": [[self.index(gid), bwd] for gid, bwd in keys],
            "graphs": [{"graph_id": self.index(gid), "bwd": bwd, **self._graphs[(gid, bwd)]} for gid, bwd in keys],
            "tasks": self.tasks,
            "device_total_bytes": self.device_total_bytes,
            **{key: value for key, value in self.step_facts.items() if value is not None},
        }


def graph_nodes_profile(graph: Graph, mem: list, complete: bool, unknown_peak: int,
                        bwd: bool = False) -> tuple[list[dict], bool]:
    """Node peaks and the bytes still allocated after each node, from DeepCompile's memory records [(name,
    current_alloc, delta, peak)], in execution order. An incomplete profile gives every node `unknown_peak` (the
    device total): plan as if nothing fits."""
    names = profiled_node_names(graph)
    records = {record[0]: record for record in mem}
    complete = complete and bool(mem) and all(name in records for name in names)
    if not complete:
        return [{"name": name, "peak_bytes": unknown_peak} for name in names], False
    # a forward graph's inputs (parameters, the batch) stay alive in the running step too
    freed = inputs_freed_before(graph) if bwd else {}
    return [{"name": name, "peak_bytes": max(0, int(records[name][3])), "alloc_bytes": max(0, int(records[name][1])),
             **({"inputs_freed_bytes": freed[name]} if bwd else {})} for name in names], True


def inputs_freed_before(graph: Graph) -> dict[str, int]:
    """Node name -> bytes of the graph's inputs whose last use came before it. The profiler holds every input until
    the graph ends; the compiled graph drops each after its last use (AOT autograd hands the backward its saved
    tensors to consume). Parameters (`primals_*`: ZeRO-3 shards the module keeps) are not freed by that."""
    position = {node: index for index, node in enumerate(graph.nodes)}
    freed_after: dict[int, int] = {}
    for node in graph.nodes:
        if node.op != "placeholder" or node.name.startswith("primals"):
            continue
        value = node.meta.get("val")
        users = [position[user] for user in node.users if not ops.is_offload_op(user)]
        if isinstance(value, torch.Tensor) and users:
            last = max(users)
            freed_after[last] = freed_after.get(last, 0) + value.numel() * value.element_size()
    freed, running = {}, 0
    for index, node in enumerate(graph.nodes):
        freed[node.name] = running
        running += freed_after.get(index, 0)
    return freed


def _memory_records(profiling_results, graph_id: int, bwd: bool) -> tuple[list, bool]:
    result = profiling_results.get(graph_id)
    if result is None:
        return [], False
    if bwd:
        return list(result.bwd_mem), bool(getattr(result, "bwd_mem_complete", True))
    return list(result.fwd_mem), bool(getattr(result, "fwd_mem_complete", True))


# ---------------------------------------------------------------- run-dir files


class PlanFiles:
    """profile.json (the latest profile, the planner CLI's input) and plan.json: the plan itself, or, once a
    run has planned in more than one phase, an object keyed by phase number."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self._plans: dict[int, dict] = {}

    def write(self, phase: int, profile: dict, plan: dict) -> None:
        os.makedirs(self.run_dir, exist_ok=True)
        self._plans[phase] = plan
        runfiles.write_json(os.path.join(self.run_dir, runfiles.PROFILE), profile)
        body = plan if len(self._plans) == 1 else {str(key): value for key, value in sorted(self._plans.items())}
        runfiles.write_atomic(os.path.join(self.run_dir, runfiles.PLAN), plan_to_json(body) + "\n")


# ---------------------------------------------------------------- the passes


def _is_rank0() -> bool:
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


class OffloadPass:
    """State of our passes across the graphs of one phase. `evict` and `plan` are the registered pass functions.
    `budget_bytes` None: the auto rule at the device limit (plan.plan_for_device) instead of a budget."""

    def __init__(self, runtime: OffloadRuntime, zero_optimizer, budget_bytes: int | None, reload_policy: str,
                 files: PlanFiles, device_total_bytes: int, current_phase: Callable[[], int],
                 writes_files: Callable[[], bool] = _is_rank0, release_policy: str = "recorded",
                 cap_bytes: int | None = None):
        self.runtime = runtime
        self.zero_optimizer = zero_optimizer
        self.budget_bytes = budget_bytes
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
        self.last_plan: dict | None = None   # the last final plan (made at the last backward graph)
        self._overhead_bytes: int | None = None  # reserved less allocated after the planning step's eviction

    def evict(self, gm: GraphModule, graph_id: int, graph_order, profiling_results, create_inputs_fn,
              mem_budget, param_manager, bwd: bool) -> None:
        if bwd or not graph_order or graph_order[0][0] != graph_id:
            return None
        self.runtime.adopt(discover_tasks(self.zero_optimizer))
        with unset_fake_temporarily():  # compilers call passes under a fake mode; these copies are real
            moved = self.runtime.evict_all()
            if self.budget_bytes is None:  # the device rule counts what the allocator holds beyond live bytes
                self._overhead_bytes = self.runtime.allocator_overhead_bytes()
        logger.info("offload: evicted %d optimizer states (%.2f GB) before profiling", len(self.runtime.slots),
                    moved / 1e9)
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
        mem, complete = _memory_records(profiling_results, graph_id, bwd)
        nodes, complete = graph_nodes_profile(graph, mem, complete, self.device_total_bytes, bwd)
        if not complete:
            logger.warning("offload: no complete memory profile for graph %d (bwd=%s); planning as if it used "
                           "the whole device", graph_id, bwd)
        # the first record is an input's: the profiler's reading before the graph allocates anything
        self._builder.add(graph_id, bwd, nodes, complete, int(mem[0][1]) if complete else None)

    def _start_phase(self) -> None:
        self.runtime.adopt(discover_tasks(self.zero_optimizer))
        self.runtime.begin_phase()
        tasks = [{"id": slot.task.id, "bytes": slot.task.nbytes} for slot in self.runtime.slots.values()]
        self._builder = ProfileBuilder(tasks, self.device_total_bytes)
        self._placements = {}
        self._release_sites = {}

    def _plan_forward(self, graph: Graph, graph_id: int, graph_order, profiling_results) -> None:
        first = graph_id == graph_order[0][0]
        if first or self._builder is None:
            self._start_phase()
        self._record(graph, graph_id, profiling_results, bwd=False)
        if first:
            task_ids = tuple(self.runtime.slots)
            insert_head_ops(graph, [(ops.EMPTY_CACHE, ops.REGISTRY.add(ops.EMPTY_CACHE)),
                                    (ops.LAUNCH, ops.REGISTRY.add(ops.LAUNCH, task_ids))])
        if self.release_policy == "ordered":
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
        if self.budget_bytes is None:
            limit = device_limit_bytes(self.device_total_bytes, self._overhead_bytes)
            plan = plan_for_device(profile, limit, self.reload_policy, self.release_policy)
        else:
            plan = make_plan(profile, self.budget_bytes, self.reload_policy, self.release_policy, self.cap_bytes)
        self._placements.pop(graph_id, None)  # this graph's ops were stripped: its reloads are placed anew
        reloads = self._reloads_here(plan, graph_id, is_last)
        entries = [(ops.REGISTRY.add(ops.RELOAD, (task,)), task, after) for task, after in reloads]
        index = self._builder.index(graph_id)
        self._placements[graph_id] = [{"graph_id": index, **placement}
                                      for placement in insert_reloads(graph, entries)]
        if is_last:
            insert_end_backward(graph, ops.REGISTRY.add(ops.END_BACKWARD))
            self._finish(plan)

    def _step_facts(self) -> dict:
        """What the profile alone gets wrong about the step as it runs (profile.py)."""
        masters = self.zero_optimizer.fp32_partitioned_groups_flat
        return {"measured_start_bytes": self.runtime.forward_start_bytes,
                "step_transient_bytes": max((flat.numel() * flat.element_size() for flat in masters), default=0),
                "allocator_overhead_bytes": self._overhead_bytes}

    def _reloads_here(self, plan: dict, graph_id: int, is_last: bool) -> list[tuple[str, str | None]]:
        """(task, after-node) reloads for this graph. Before the last backward graph, a reload the plan puts
        after this graph's last node only means "not yet" (the planner has not seen the later graphs)."""
        index, last_node = self._builder.index(graph_id), self._builder.last_node(graph_id, bwd=True)
        elsewhere = {placement["task"] for placements in self._placements.values() for placement in placements}
        chosen = [(reload["task"], reload["after_node"]) for reload in plan["reloads"]
                  if reload["graph_id"] == index and reload["task"] not in elsewhere
                  and (is_last or reload["after_node"] != last_node)]
        if is_last:
            placed = elsewhere | {task for task, _ in chosen}
            chosen += [(task, None) for task in plan["offloaded"] if task not in placed]
        return chosen

    def _sites_of_releases(self, plan: dict) -> dict[str, tuple[str, ...]]:
        """Release op site -> the states it frees: for each planned release, the last site at or before the node
        the planner named, in that forward graph."""
        chosen: dict[str, list[str]] = {}
        for release in plan["releases"]:
            graph = release["graph_id"]
            position = {node["name"]: index for index, node in enumerate(self._builder.nodes(graph, bwd=False))}
            limit = position[release["before_node"]]
            earlier = [name for name in self._release_sites.get(graph, []) if position[name] <= limit]
            if not earlier:  # a forward graph compiled without sites: the state stays held until its reload
                continue
            chosen.setdefault(f"{graph}:{max(earlier, key=position.get)}", []).append(release["task"])
        return {site: tuple(tasks) for site, tasks in chosen.items()}

    def _finish(self, plan: dict) -> None:
        release_sites = self._sites_of_releases(plan)
        self.runtime.finalize_plan(plan["offloaded"], release_sites)
        self.last_plan = plan
        phase = self.current_phase()
        placements = [placement for graph in self._placements.values() for placement in graph]
        record = {**plan, "phase": phase, "profile_complete": self._builder.complete, "placements": placements,
                  "release_sites": {site: list(tasks) for site, tasks in release_sites.items()}}
        if self.writes_files():
            self.files.write(phase, self._builder.to_dict(), record)
            # one line in the worker log: the fact a reader of a run needs first
            print(f"offload: phase {phase} plan: {len(plan['offloaded'])} of {len(self.runtime.slots)} states "
                  f"offloaded ({plan['offloaded_bytes'] / 1e9:.2f} of {plan['total_state_bytes'] / 1e9:.2f} GB), "
                  f"{len(placements)} reload ops, predicted peak {plan['predicted_peak_bytes'] / 1e9:.2f} GB, "
                  f"budget {plan['budget_bytes'] / 1e9:.2f} GB, feasible={plan['feasible']}", flush=True)
