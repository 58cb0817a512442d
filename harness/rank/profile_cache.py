"""Reuse across the points of a sweep (`sweep.reuse`, on by default since its GPU test passed): DeepCompile's
profiling runs, made once per graph and reused by every later point of the same key, and inductor's and Triton's
caches in the sweep dir.

What is reused. DeepCompile profiles each graph it compiles by running it, node by node, many times
(ProfilingInterpreter: node times and memory, inside the ZeRO-3 gather/release pass; MemoryProfilingInterpreter:
the memory after each pass that rewrites the graph). What those runs leave is the nodes' profile metadata (and
the memory records), which DeepCompile's scheduler, its prefetch and our planner read. That is what is kept, per
phase, per graph (a fingerprint of its nodes, args included) and per occurrence of that graph in the phase, under
a key of everything the profiles depend on (`key_facts`); any difference is another key, so nothing made under
other facts is read. Our own profile and plan are not cached: they are made from those records and from the steps
the point runs (cheap, timed in worker.json's wall_split), and the plan is what differs between a sweep's budgets.

The key leaves out only what cannot change a profile: the step counts, the offload budget (our pass evicts every
state before profiling; DeepSpeed's pass inserts its budget-dependent ops before DeepCompile re-profiles, and those
ops are in the graph fingerprint), logging, timeouts and fault injection. `train.repeat` stays in by default:
repeats measure the whole pipeline, profiling included. `sweep.reuse_repeats=true` takes it out, so a point's later
repeats reuse its first repeat's profiles; DeepCompile schedules from the profiles, so those repeats also run one
schedule and compile the same graphs, which can hit inductor's FX graph cache. Ranks agree on each hit (a
collective), so they skip a profiling run together or run it together; rank 0 writes the entries (the interpreters
reduce every value over the ranks).

The inductor and Triton caches go to one directory per sweep and harness version (inductor's key does not cover
our ops' Python code), so every point of a sweep shares them; their FX graph entries match across points only with
`sweep.stable_graph_ids` (on by default; graph_ids.py).
"""
from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Mapping

from harness.contract import envinfo, runfiles, schema
from harness.contract.runfiles import digest, write_atomic

logger = logging.getLogger(__name__)

CACHE_DIR = "compile_cache"  # in the sweep dir; the reader skips folders without run files
# Keys of a point's config that cannot change what DeepCompile's profiling measures.
NOT_IN_KEY = {"train": ("steps", "measure_steps", "warmup_steps"),
              "offload": ("budget_gb", "budget_fraction", "margin"),
              "launcher": ("timeout_s", "stall_timeout_s", "dist_timeout_min", "requeue", "gpu_memory_gb",
                           "log_level", "rdzv_backend", "rdzv_endpoint", "rdzv_port")}
KEYED_GROUPS = ("model", "arm", "train", "offload", "env", "launcher")
PROFILE_META = ("device_time", "wall_time", "alloc_mem", "max_mem", "tensor_size", "profile_mem_start",
                "profile_mem_peak")  # what ProfilingInterpreter leaves on each node
MEMORY_META = ("profile_mem_start", "profile_mem_peak")  # what MemoryProfilingInterpreter leaves on each node


def harness_version() -> dict[str, str] | None:
    """The checkout's commit and a hash of what differs from it: the code identity `sweep.resume` compares
    (env.json's git_sha and git_diff_sha256, which leave out the committed campaigns under results/, so archiving
    one between two calls of a sweep does not turn its later points' reuse into misses); None outside a git
    checkout, where no key can tell two versions apart."""
    state, _ = envinfo.git_state()
    if state["git_sha"] is None or state["git_dirty"] is None:
        return None
    return {"git_sha": state["git_sha"], "dirty_diff": (state["git_diff_sha256"] or "")[:20]}


def versions(device_name: str | None) -> dict[str, Any] | None:
    """What the profiles' code and device are: torch, CUDA, DeepSpeed, the harness, the GPU model."""
    import deepspeed
    import torch

    harness = harness_version()
    if harness is None:
        return None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "deepspeed": deepspeed.__version__,
            "harness": harness, "device": device_name}


def key_facts(cfg: Mapping[str, Any], versions_now: Mapping[str, Any]) -> dict[str, Any]:
    """Everything a point's DeepCompile profiles depend on: its config groups less NOT_IN_KEY (the world size is
    in the launcher group, the emulated device size in env), the race-stress delay, and the versions; the repeat
    index too unless `sweep.reuse_repeats`."""
    facts: dict[str, Any] = {}
    for group in KEYED_GROUPS:
        values = dict(cfg.get(group) or {})
        for name in NOT_IN_KEY.get(group, ()):
            values.pop(name, None)
        facts[group] = values
    if (cfg.get("sweep") or {}).get("reuse_repeats"):  # absent in configs written before the key: false
        facts["train"].pop("repeat", None)
    facts["copy_delay_us"] = (cfg.get("debug") or {}).get("copy_delay_us")
    facts["versions"] = dict(versions_now)
    return facts


def sweep_dir_of(run_dir: Path) -> Path | None:
    """The sweep dir a run dir belongs to (None for a single run: reuse is across a sweep's points)."""
    parent = Path(run_dir).resolve().parent
    return parent if (parent / runfiles.MULTIRUN).is_file() else None


def point_caches_at(sweep_dir: Path, versions_now: Mapping[str, Any]) -> None:
    """Send inductor's and Triton's caches to the sweep's directory for these versions (inductor keeps its FX graph
    and AOTAutograd caches under its own); both read these variables when they first compile."""
    root = sweep_dir / CACHE_DIR / f"inductor-{digest(versions_now)}"
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root)
    os.environ["TRITON_CACHE_DIR"] = str(root / "triton")


def open_for(config: schema.Config, run_dir: Path, rank: int, device_name: str | None) -> ProfileCache | None:
    """This point's cache, its inductor and Triton caches pointed at the sweep's; None where nothing is reused:
    `sweep.reuse=false`, a single run (no sweep dir), or a checkout git cannot describe (no key could tell two
    versions of the harness apart)."""
    sweep_dir = sweep_dir_of(run_dir)
    if not config.sweep.reuse or sweep_dir is None:
        return None
    versions_now = versions(device_name)
    if versions_now is None:
        logger.warning("profile_cache: git cannot describe this checkout; nothing is reused across the sweep")
        return None
    point_caches_at(sweep_dir, versions_now)
    # The key digests the groups as config.yaml holds them, so a key made before a schema change still matches.
    cache = ProfileCache(sweep_dir, key_facts(config.written, versions_now), writes=rank == 0)
    if config.sweep.stable_graph_ids:  # so that inductor's FX graph cache can hit across the points too
        from harness.rank import graph_ids

        cache.stable_graph_ids = graph_ids.install()
    return cache


# --- one graph's fingerprint ----------------------------------------------------------------------------------

def _stable(value: Any, graph_ids: frozenset[int]) -> Any:
    """An FX argument as text that is the same in every process and on every rank: nodes by name, devices by
    type, DeepCompile's graph ids (the id() of a graph, which its ops carry) as one token."""
    import torch
    from torch.fx import Node

    if isinstance(value, Node):
        return f"%{value.name}"
    if isinstance(value, torch.device):
        return f"device:{value.type}"
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return "<graph>" if value in graph_ids else repr(value)
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, *(_stable(item, graph_ids) for item in value)]
    if isinstance(value, dict):
        return {str(key): _stable(item, graph_ids) for key, item in sorted(value.items(), key=lambda kv: str(kv[0]))}
    return repr(value)


def _shape_of(node) -> str | None:
    value = node.meta.get("val")
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    return None if shape is None else f"{dtype}{list(shape)}"


def _target_name(target: Any) -> str:
    """An op by name: a Python function's text would carry its address, which differs between processes."""
    text = str(target)
    if " at 0x" not in text:
        return text
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', type(target).__qualname__)}"


def fingerprint(graph, graph_ids: frozenset[int] = frozenset()) -> str:
    """The graph's nodes in order: op, name, target, args, kwargs and output shape; two graphs with the same
    fingerprint run the same ops on the same shapes. `graph_ids`: the ints that are graph ids in this process."""
    nodes = [[node.op, node.name, _target_name(node.target), _stable(node.args, graph_ids),
              _stable(node.kwargs, graph_ids), _shape_of(node)] for node in graph.nodes]
    return digest(nodes)


# --- the cache ---------------------------------------------------------------------------------------------------

class ProfileCache:
    """One key's entries: `<sweep>/compile_cache/profiles/<key>/`, key.json (its facts) and one file per phase,
    kind, graph and occurrence."""

    def __init__(self, sweep_dir: Path, facts: Mapping[str, Any], writes: bool):
        self.key = digest(facts)
        self.dir = sweep_dir / CACHE_DIR / "profiles" / self.key
        self.writes = writes
        self.facts = dict(facts)
        self.stable_graph_ids = False  # graph_ids.install() ran: DeepCompile's graph ids are Dynamo's compile ids
        self.lookups: dict[int, dict[str, int]] = defaultdict(lambda: {"hit": 0, "miss": 0})
        # per phase, each profiled graph's kind and fingerprint in order: DeepCompile's gather/release schedule is
        # made from the profiled memory, so two runs that profiled afresh can compile different graphs, and this
        # says whether they did
        self.graphs: dict[int, list[str]] = defaultdict(list)
        self._seen: dict[tuple, int] = defaultdict(int)
        if writes:
            self.dir.mkdir(parents=True, exist_ok=True)
            write_atomic(self.dir / "key.json", json.dumps(self.facts, indent=1, sort_keys=True, default=str))

    def entry_path(self, phase: int, kind: str, graph_print: str) -> Path:
        """The file of this graph's next occurrence in the phase (a graph profiled twice gets two)."""
        occurrence = self._seen[(phase, kind, graph_print)]
        self._seen[(phase, kind, graph_print)] += 1
        return self.dir / f"p{phase}-{kind}-{graph_print}-{occurrence}.json"

    def load(self, path: Path) -> dict | None:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def store(self, path: Path, entry: dict) -> None:
        if self.writes:
            write_atomic(path, json.dumps(entry))

    def facts_for_worker(self) -> dict[str, Any]:
        """worker.json's profile_cache: the key (its facts are in key.json beside the entries) and, per phase,
        the profiling runs reused (hit) and made (miss) and the graphs profiled, and whether graph ids were made
        stable."""
        return {"key": self.key, "dir": str(Path(CACHE_DIR) / "profiles" / self.key),
                "lookups": {str(phase): dict(counts) for phase, counts in sorted(self.lookups.items())},
                "graphs": {str(phase): list(prints) for phase, prints in sorted(self.graphs.items())},
                "stable_graph_ids": self.stable_graph_ids}


def _all_ranks_have(found: bool, interpreter) -> bool:
    """Whether every rank of the interpreter's group found its entry (a collective every rank reaches)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return found
    flag = torch.tensor([1 if found else 0], device=interpreter.device, dtype=torch.int)
    dist.all_reduce(flag, dist.ReduceOp.MIN, group=interpreter.process_group)
    return bool(flag.item())


def _graph_ids() -> frozenset[int]:
    from deepspeed.compile import backend

    return frozenset(backend.profiling_results)


def _capture(interpreter, kind: str) -> dict | None:
    """What a finished profiling run left (None where it is incomplete: nothing is kept)."""
    from deepspeed.compile.profilers.graph_profile import is_profile_incomplete

    if kind == "memory":
        if not interpreter.profile_complete:
            return None
        return {"meta": {node.name: {name: node.meta[name] for name in MEMORY_META if name in node.meta}
                         for node in interpreter.graph.nodes},
                "mem_record": [list(record) for record in interpreter.mem_record]}
    if is_profile_incomplete(interpreter.graph):
        return None
    return {"meta": {node.name: {name: node.meta[name] for name in PROFILE_META} for node in interpreter.graph.nodes}}


def _apply(interpreter, kind: str, entry: dict) -> None:
    for node in interpreter.graph.nodes:
        node.meta.update(entry["meta"][node.name])
    if kind == "memory":
        interpreter.mem_record = [tuple(record) for record in entry["mem_record"]]
        interpreter.profile_complete = True


def _fits(interpreter, entry: dict | None) -> bool:
    return entry is not None and set(entry["meta"]) == {node.name for node in interpreter.graph.nodes}


def install(cache: ProfileCache | None, current_phase: Callable[[], int | None]) -> Callable[[], dict[int, float]]:
    """Wrap DeepCompile's two profiling interpreters: time every run per phase, and with a cache, reuse an entry
    every rank has instead of running the graph, and keep each complete run's result. Returns the seconds of
    profiling per phase so far (the runs that were made)."""
    from deepspeed.compile.profilers import graph_profile

    seconds: dict[int, float] = {}
    for kind, cls in (("profile", graph_profile.ProfilingInterpreter),
                      ("memory", graph_profile.MemoryProfilingInterpreter)):
        cls.run = _wrapped(cls.run, kind, cache, current_phase, seconds)
    return lambda: dict(seconds)


def _wrapped(run: Callable, kind: str, cache: ProfileCache | None, current_phase: Callable[[], int | None],
             seconds: dict[int, float]) -> Callable:
    @functools.wraps(run)
    def profiled_run(interpreter, *args, **kwargs):
        phase = current_phase() or 0
        path = entry = None
        if cache is not None:
            graph_print = fingerprint(interpreter.graph, _graph_ids())
            cache.graphs[phase].append(f"{kind}-{graph_print}")
            path = cache.entry_path(phase, kind, graph_print)
            entry = cache.load(path)
            if _all_ranks_have(_fits(interpreter, entry), interpreter):
                _apply(interpreter, kind, entry)
                cache.lookups[phase]["hit"] += 1
                return None  # DeepCompile discards what a profiling run returns
            cache.lookups[phase]["miss"] += 1
        start = time.perf_counter()
        result = run(interpreter, *args, **kwargs)
        seconds[phase] = seconds.get(phase, 0.0) + time.perf_counter() - start
        if cache is not None:
            captured = _capture(interpreter, kind)
            if captured is not None:
                cache.store(path, captured)
        return result

    return profiled_run
