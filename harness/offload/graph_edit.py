"""Editing DeepCompile's FX graphs: where our ops go and what they are anchored on.

Anchors: the graph passes each op a tensor to depend on, and the op runs after whatever produced it. A reload
is anchored on the first suitable tensor at or after the node the plan puts it after, never on a graph input or
a view of one (inductor could schedule it before any compute). Suitable, in order of preference:
1. the output of a DeepSpeed barrier op (`dc::reduce_grad`, issued right after each gradient is computed): an
   extern kernel's fresh, empty output, so reading it changes nothing in how inductor fuses or rounds compute;
2. otherwise (graphs without them) the output of an aten computation. Reading it forces inductor to keep that
   value in memory, which can change fusion and bf16 rounding slightly; hence only the fallback.
Launch and empty-cache ops are anchored on a graph input on purpose: they belong at the very start.
"""
from __future__ import annotations

import operator
from typing import Iterable

import torch
from torch.fx import Graph, Node
from torch.fx.passes.shape_prop import TensorMetadata

from harness.offload import ops

_COMPUTE_NAMESPACES = ("aten", "prims")
RELEASE_SITES = 32  # per forward graph: fine enough to track the forward's memory growth, cheap per step
PREFERRED_ANCHOR_OPS = frozenset({"dc::reduce_grad"})


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
