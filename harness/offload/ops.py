"""The graph-side half of the offload runtime: our custom ops, the registry their int argument indexes, and counters.

Every op has the schema `(Tensor anchor, int idx) -> ()`. The graph carries only a tensor anchor (so the op has
something to depend on and dispatch by) and an index into `REGISTRY`; the tensors being moved stay in Python
state, so compiled code never holds them. Nothing consumes the ops' (empty) output, so two dead-code
eliminations would drop them: FX's, which `_side_effectful_functions` guards, and inductor's, which keys off
`is_impure` and therefore off the ORDERED effect registered here. The ORDERED effect also marks them as
ordered among themselves; their position relative to compute comes from the anchor they read (see
graph_pass.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol

import torch
import torch.fx

NAMESPACE = "offload_harness"
LAUNCH = "launch_offloads"      # start the device-to-host copies of the planned states
RELOAD = "reload_state"         # start the host-to-device copy of one state
EMPTY_CACHE = "empty_cache"     # apply the empty_cache policy (head of the first forward graph)
END_BACKWARD = "end_backward"   # end of the last backward graph: everything must be on its way back
RELEASE = "release_states"      # release=ordered: free the device blocks the plan assigns to this site
OP_NAMES = (LAUNCH, RELOAD, EMPTY_CACHE, END_BACKWARD, RELEASE)


@dataclass
class Counters:
    """Cumulative since process start; the worker turns them into per-step deltas."""
    offload_launches: int = 0
    reloads: int = 0
    offload_bytes: int = 0
    reload_bytes: int = 0
    empty_cache_calls: int = 0
    offload_cycles: int = 0     # launch ops that sent states out: one per optimizer step, whatever the accumulation


COUNTERS = Counters()


def counters() -> dict:
    return asdict(COUNTERS)


@dataclass(frozen=True)
class OpEntry:
    kind: str                   # one of OP_NAMES
    task_ids: tuple[str, ...]   # the states this op acts on (empty for EMPTY_CACHE / END_BACKWARD / RELEASE)
    site: str = ""              # RELEASE: "graph:node" it sits before; the plan, made later, assigns its states


class OpRegistry:
    """int in the graph -> what the op does. Append-only: an index stays valid for as long as any compiled graph
    that carries it can still run (a recompile mid-phase must not repoint an older graph's ops)."""

    def __init__(self) -> None:
        self._entries: list[OpEntry] = []

    def add(self, kind: str, task_ids: tuple[str, ...] = (), site: str = "") -> int:
        if kind not in OP_NAMES:
            raise ValueError(f"unknown offload op kind {kind!r}")
        self._entries.append(OpEntry(kind, tuple(task_ids), site))
        return len(self._entries) - 1

    def entry(self, idx: int) -> OpEntry:
        return self._entries[idx]

    def __len__(self) -> int:
        return len(self._entries)


REGISTRY = OpRegistry()


class OpRuntime(Protocol):
    """What the ops call into (runtime.OffloadRuntime)."""

    def run_op(self, entry: OpEntry) -> None: ...


_runtime: OpRuntime | None = None


def bind_runtime(runtime: OpRuntime | None) -> None:
    global _runtime
    _runtime = runtime


def _dispatch(kind: str, idx: int) -> None:
    if _runtime is None:
        # A compiled graph outliving its runtime would silently skip moving states back: fail instead.
        raise RuntimeError(f"{NAMESPACE}::{kind} ran with no offload runtime bound")
    entry = REGISTRY.entry(idx)
    if entry.kind != kind:
        raise RuntimeError(f"{NAMESPACE}::{kind} got registry index {idx}, which holds a {entry.kind} op")
    _runtime.run_op(entry)


def _make_impl(kind: str):
    def impl(anchor: torch.Tensor, idx: int) -> None:
        _dispatch(kind, idx)
    return impl


def _meta_impl(anchor: torch.Tensor, idx: int) -> None:
    return None


_library: torch.library.Library | None = None


def op(kind: str) -> torch._ops.OpOverload:
    return getattr(getattr(torch.ops, NAMESPACE), kind).default


def register_ops() -> None:
    """Define the ops once per process (a namespace can be defined only once); later calls are no-ops."""
    global _library
    if _library is not None:
        return
    from torch._higher_order_ops.effects import _EffectType, _register_effectful_op

    library = torch.library.Library(NAMESPACE, "DEF")
    for kind in OP_NAMES:
        library.define(f"{kind}(Tensor anchor, int idx) -> ()")
        library.impl(kind, _make_impl(kind), "CompositeExplicitAutograd")
        library.impl(kind, _meta_impl, "Meta")
    for kind in OP_NAMES:
        overload = op(kind)
        torch.fx.node._side_effectful_functions.add(overload)
        _register_effectful_op(overload, _EffectType.ORDERED)
    _library = library  # the ops are deregistered if the Library object is garbage collected


def effect_of(overload: torch._ops.OpOverload):
    """The effect registered for an op (None if none), across torch versions."""
    from torch._higher_order_ops import effects
    if hasattr(effects, "_get_effect"):
        return effects._get_effect(overload)
    return effects.SIDE_EFFECTS.get(overload)


def is_offload_op(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) \
        and node.target.namespace == NAMESPACE
