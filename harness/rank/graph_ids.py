"""DeepCompile's graph ids made the same in every process (`sweep.stable_graph_ids`), so that inductor's FX graph
cache can hit across the points of a sweep.

Why: DeepCompile names each graph it compiles by the graph's address (`id(gm.graph)` in
deepspeed/compile/backend.py) and writes that number into every op it inserts (the ZeRO-3 gathers and releases,
the prefetch). Inductor's cache key covers the graph's code, so a number that differs in every process makes every
point of a sweep miss (measured on a GPU: `fx_graph_cache_miss` 2, no hit, in both phases of a point that reused
every profile). Dynamo's compile id (frame, compile of that frame) names the same graph in every process of the
same program instead; DeepCompile already orders its graphs by that frame id.

How: the backend module looks `id` up in its own globals before the builtins, so a global of that name there
replaces the address for that module alone, and only for graphs (anything else still gets its address). Ids are
unique within a phase, the only scope DeepCompile keeps them in: at each switch of its schedule it resets Dynamo
(compile ids start again) and clears what it kept per graph. A DeepSpeed whose backend no longer names graphs by
`id(gm.graph)` is left alone, with one warning line.

Installed only where `sweep.reuse` opens the sweep's caches (profile_cache.open_for). On by default (conf/config.yaml;
`sweep.stable_graph_ids=false` turns it off) since tests/test_offload_gpu.py -k stable passed on an H100 (2026-12-06,
from commit 5fab67f): in its two-budget sweep the later point's FX graph cache hit 2 of 2 graphs in phase 0 and 1 of
2 in phase 1 (the phase-1 backward differs by budget: our pass edits it), and the later point took 0.56x the first's
wall time, 0.65x without stable ids (test readings, 5 measured steps a point; harness/README.md has the rest).
"""
from __future__ import annotations

import builtins
import inspect
import logging
from typing import Any

logger = logging.getLogger(__name__)

STABLE_BASE = 2**40         # above any small int DeepCompile uses as an id of its own (ds_id counts from 0)
COMPILES_PER_FRAME = 4096   # room for a frame's recompiles before two frames' ids could meet
NAMED_BY_ADDRESS = "id(gm.graph)"


def stable_graph_id(graph: Any) -> int | None:
    """The id of an FX graph from the Dynamo compile that made it; None where it has none (not from Dynamo)."""
    module = getattr(graph, "owning_module", None)
    compile_id = getattr(module, "meta", {}).get("dynamo_compile_id") if module is not None else None
    frame_compile_id = getattr(compile_id, "frame_compile_id", None)
    if compile_id is None or compile_id.frame_id is None or frame_compile_id is None:
        return None
    if frame_compile_id >= COMPILES_PER_FRAME:
        return None
    return STABLE_BASE + compile_id.frame_id * COMPILES_PER_FRAME + frame_compile_id


def graph_or_address_id(value: Any) -> int:
    """What the backend's `id` returns once installed: a Dynamo graph's stable id, else the builtin's address."""
    from torch.fx import Graph

    if isinstance(value, Graph):
        stable = stable_graph_id(value)
        if stable is not None:
            return stable
    return builtins.id(value)


def install() -> bool:
    """Name DeepCompile's graphs by their compile ids in this process; False (and one warning) where this
    DeepSpeed's backend does not name them by address, so there is nothing to replace."""
    from deepspeed.compile import backend

    try:
        source = inspect.getsource(backend.make_backend)
    except (OSError, TypeError):
        source = ""
    if NAMED_BY_ADDRESS not in source:
        logger.warning("sweep.stable_graph_ids: this DeepSpeed's backend does not name graphs by "
                       f"{NAMED_BY_ADDRESS}; graph ids stay as DeepSpeed makes them")
        return False
    backend.id = graph_or_address_id
    return True
