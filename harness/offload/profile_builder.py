"""One phase's memory profile in the planner's format (profile.py), built from DeepCompile's profiling results."""
from __future__ import annotations

import torch
from torch.fx import Graph

from harness.offload import ops
from harness.offload.graph_edit import profiled_node_names


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


def readings_before(names: list[str], mem: list) -> list:
    """DeepCompile's memory records of a graph from before a pass added nodes to it (prefetch's fused all-gathers),
    completed for the graph as it is now: a node the earlier profile lacks reads as the node before it, which is
    what it holds beside the parameters that pass gathers."""
    records, previous, added = {record[0]: record for record in mem}, (0, 0), []
    for name in names:
        if name in records:
            previous = (records[name][1], records[name][3])
        else:
            added.append((name, previous[0], 0, previous[1]))
    return list(mem) + added


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


def memory_records(profiling_results, graph_id: int, bwd: bool) -> tuple[list, bool]:
    result = profiling_results.get(graph_id)
    if result is None:
        return [], False
    if bwd:
        return list(result.bwd_mem), bool(getattr(result, "bwd_mem_complete", True))
    return list(result.fwd_mem), bool(getattr(result, "fwd_mem_complete", True))
