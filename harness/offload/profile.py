"""The planner's input: one rank's memory profile of a training step (profile.json), parsed and validated.

No torch. Written by the DeepCompile pass (graph_pass.py) from DeepSpeed's profiling results; read by the planner
(plan.py) and its CLI. Fields beyond the graphs and tasks are optional, so profiles from older runs still load:
- per node `alloc_bytes` (bytes still allocated after it) and, in backward graphs, `inputs_freed_bytes` (bytes of
  the graph's saved-activation inputs whose last use came before the node: the profiler holds every input to the
  end, the compiled graph frees each after its last use);
- per graph `start_alloc_bytes` (the profiler's reading before the graph's first node);
- `measured_start_bytes` (allocated bytes at the start of this step's forward, with every state evicted, read by our
  op: the profiler adds memory used outside torch to every reading, the allocator does not);
- `step_transient_bytes` (what the optimizer step allocates on top of the states: measured on the last steady
  step before planning where there was one (the gradient norm's fp64 copies, one sub-group's fp32 gradient and the
  optimizer's temporaries, whichever is largest), else one sub-group's fp32 gradient);
- `reduce_bucket_bytes` (DeepCompile's gradient reduce buckets: allocated in full at backward's first gradient
  and held to its end, never while profiling);
- `accumulation_recv_bytes` (gradient accumulation only: from an optimizer step's second micro-batch on, each bucket
  is reduced into a temporary receive buffer, one bucket's share per rank, and added to the gradient partitions;
  the partitions themselves persist at any accumulation and are in `measured_start_bytes`);
- `measured_fwd_bwd_peak_bytes` (the allocated peak of forward + backward on the last steady step before
  planning, less the states on the device then: the profiled graphs as they really run, compiled);
- `allocator_overhead_bytes` (reserved less allocated after emptying the cache at the planning step: what the
  allocator holds beyond the live bytes; the auto rule at a device limit subtracts it from the device size);
- `prefetch_bytes` and `gathered_bytes` (`offload.compose`): what DeepCompile's prefetch and selective-gather passes
  hold on top of the nodes as profiled (see `hold`). Known only once those passes have run in the planning step on
  the GPU, so the pass measures them there (graph_pass.py) and the planner takes them as inputs.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.contract import safe_read
from harness.contract.checks import shown
from harness.contract.errors import ConfigError

# No device holds a petabyte: a byte count past it is a malformed reading (and a plan's sums of it would overflow
# the floats the planner reports in).
MAX_BYTES = 10 ** 15


@dataclass(frozen=True)
class Node:
    graph_id: int
    bwd: bool
    name: str
    peak_bytes: int
    inputs_freed_bytes: int = 0


@dataclass(frozen=True)
class Task:
    """One offload task as the planner sees it (states.Task on the device): its id and its bytes."""
    id: str
    bytes: int


@dataclass(frozen=True)
class Profile:
    nodes: tuple[Node, ...]  # all graphs' nodes in execution order
    tasks: tuple[Task, ...]  # in the order the optimizer step touches them
    outside_bytes: int = 0   # the profiler's readings minus the allocator's (0: not measured)
    measured_start_bytes: int | None = None
    step_transient_bytes: int = 0
    reduce_bucket_bytes: int = 0
    measured_fwd_bwd_peak_bytes: int | None = None
    accumulation_recv_bytes: int = 0
    prefetch_bytes: int = 0  # parameters DeepCompile's prefetch gathers ahead of their use, at most, at any node
    gathered_bytes: int = 0  # parameters selective gather keeps gathered through the whole step

    @property
    def held_bytes(self) -> int:
        """What the composed DeepCompile passes hold at a forward or backward node."""
        return self.prefetch_bytes + self.gathered_bytes

    @property
    def bwd_positions(self) -> list[int]:
        return [position for position, node in enumerate(self.nodes) if node.bwd]

    @property
    def forward_peak_bytes(self) -> int:
        # without forward nodes, what the composed passes hold is the forward's (nodes hold it after `hold`)
        return max((node.peak_bytes for node in self.nodes if not node.bwd), default=self.held_bytes)

    @property
    def floor_bytes(self) -> int:
        return max((node.peak_bytes for node in self.nodes), default=0)

    @property
    def total_state_bytes(self) -> int:
        return sum(task.bytes for task in self.tasks)

    @property
    def step_end_baseline_bytes(self) -> int:
        """What is allocated besides the states when the optimizer step runs: the forward's measured start (the
        gradients' buffers persist across steps), else the last backward node's peak (older profiles); plus the
        parameters selective gather keeps gathered, which stay through the optimizer step (prefetched ones are
        freed after their use)."""
        if self.measured_start_bytes is not None:
            return self.measured_start_bytes + self.gathered_bytes
        return self.nodes[self.bwd_positions[-1]].peak_bytes  # parse_profile's nodes hold them already (`hold`)


# What the run measured before planning, which the step model calibrates the eager profile by (calibrate). A profile
# recorded before the step model (the capacity campaign's) lacks them: its node peaks are the profiler's, which
# overstate the running step by gigabytes, so a peak predicted on them says nothing.
STEP_MODEL_READINGS = ("measured_start_bytes", "step_transient_bytes")


def missing_readings(profile: dict) -> tuple[str, ...]:
    """The step model's readings a profile dict lacks (none: its peaks can be predicted)."""
    return tuple(key for key in STEP_MODEL_READINGS if profile.get(key) is None)


# ---------------------------------------------------------------- validation


def expect(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(key, message)


def byte_count(value: Any, key: str) -> int:
    # bool is an int subclass; a true/false byte count is a malformed file, not 1 or 0 bytes.
    expect(isinstance(value, int) and not isinstance(value, bool), key, f"must be an integer, got {shown(value)}")
    expect(value >= 0, key, f"must be >= 0, got {value}")
    expect(value <= MAX_BYTES, key, f"must be at most {MAX_BYTES:.0e} bytes, got {shown(value)}")
    return value


def mapping(value: Any, key: str) -> dict:
    expect(isinstance(value, dict), key, f"must be an object, got {type(value).__name__}")
    return value


def sequence(value: Any, key: str) -> list | tuple:
    expect(isinstance(value, (list, tuple)), key, f"must be a list, got {type(value).__name__}")
    return value


def _graph_id(value: Any, key: str) -> int:
    expect(isinstance(value, int) and not isinstance(value, bool), key, f"must be an integer, got {shown(value)}")
    return value


def _unique_label(value: Any, key: str, seen: set, what: str, where: str = "") -> str:
    """A non-empty string not seen before (added to `seen`)."""
    expect(isinstance(value, str) and value != "", key, f"must be a non-empty string, got {shown(value)}")
    expect(value not in seen, key, f"duplicate {what} {shown(value)}{where}")
    seen.add(value)
    return value


def _parse_graph(graph: Any, key: str) -> tuple[tuple[int, bool], list[Node]]:
    graph = mapping(graph, key)
    graph_id = _graph_id(graph.get("graph_id"), f"{key}.graph_id")
    bwd = graph.get("bwd")
    expect(isinstance(bwd, bool), f"{key}.bwd", f"must be true or false, got {bwd!r}")
    nodes, seen_names = [], set()
    for index, node in enumerate(sequence(graph.get("nodes"), f"{key}.nodes")):
        node_key = f"{key}.nodes[{index}]"
        node = mapping(node, node_key)
        # Reloads are placed by node name, so a name must say which node it is.
        name = _unique_label(node.get("name"), f"{node_key}.name", seen_names, "node name", " in this graph")
        freed = byte_count(node.get("inputs_freed_bytes", 0), f"{node_key}.inputs_freed_bytes")
        nodes.append(Node(graph_id, bwd, name, byte_count(node.get("peak_bytes"), f"{node_key}.peak_bytes"), freed))
    if "start_alloc_bytes" in graph:
        byte_count(graph["start_alloc_bytes"], f"{key}.start_alloc_bytes")
    return (graph_id, bwd), nodes


def _parse_graph_order(order: Any, graphs: dict[tuple[int, bool], int]) -> list[tuple[int, bool]]:
    """Each graph exactly once, forward graphs before backward graphs (one micro-batch per step)."""
    parsed: list[tuple[int, bool]] = []
    for index, entry in enumerate(sequence(order, "profile.graph_order")):
        key = f"profile.graph_order[{index}]"
        expect(isinstance(entry, (list, tuple)) and len(entry) == 2, key,
                f"must be [graph_id, is_bwd], got {shown(entry)}")
        graph = (_graph_id(entry[0], key), entry[1])
        expect(isinstance(graph[1], bool), key, f"is_bwd must be true or false, got {shown(entry[1])}")
        expect(graph in graphs, key, f"no graph with graph_id {graph[0]} and bwd {graph[1]} in profile.graphs")
        expect(graph not in parsed, key, f"graph {graph[0]} (bwd {graph[1]}) listed twice")
        expect(graph[1] or not any(bwd for _, bwd in parsed), key, "forward graph after a backward graph")
        parsed.append(graph)
    for graph, index in graphs.items():
        expect(graph in parsed, f"profile.graphs[{index}]", "graph missing from profile.graph_order")
    return parsed


def _parse_tasks(tasks: Any) -> tuple[Task, ...]:
    parsed, seen_ids = [], set()
    for index, task in enumerate(sequence(tasks, "profile.tasks")):
        key = f"profile.tasks[{index}]"
        task = mapping(task, key)
        task_id = _unique_label(task.get("id"), f"{key}.id", seen_ids, "task id")
        parsed.append(Task(task_id, byte_count(task.get("bytes"), f"{key}.bytes")))
    return tuple(parsed)


def parse_profile(profile: Any, calibrated: bool = True) -> Profile:
    """Validate a profile dict (profile.json format); raise ConfigError naming the first bad key. The nodes come back
    calibrated to the step as it runs (see `calibrate`), or as profiled; either way holding what the composed passes
    hold (`hold`)."""
    return for_planning(read_profile(profile), calibrated)


def for_planning(read: Profile, calibrated: bool = True) -> Profile:
    """A profile as read_profile returns it, with the node peaks a plan is made on (parse_profile's); one read gives
    both kinds (make_plan places on the peaks as profiled and predicts on the calibrated ones)."""
    return hold(calibrate(read) if calibrated else read)


def read_profile(profile: Any) -> Profile:
    """The profile dict validated as parse_profile validates it, its nodes as profiled: neither calibrated nor
    holding what the composed passes hold (for_planning adds both)."""
    profile = mapping(profile, "profile")
    nodes_by_graph: dict[tuple[int, bool], list[Node]] = {}
    graph_index: dict[tuple[int, bool], int] = {}
    for index, graph in enumerate(sequence(profile.get("graphs"), "profile.graphs")):
        graph_key, nodes = _parse_graph(graph, f"profile.graphs[{index}]")
        expect(graph_key not in nodes_by_graph, f"profile.graphs[{index}]",
               f"graph {graph_key[0]} (bwd {graph_key[1]}) listed twice")
        nodes_by_graph[graph_key], graph_index[graph_key] = nodes, index
    order = _parse_graph_order(profile.get("graph_order"), graph_index)
    nodes = tuple(node for graph in order for node in nodes_by_graph[graph])
    # Reloads can only go after backward nodes, and the step's end is measured from the last one.
    expect(any(node.bwd for node in nodes), "profile.graphs", "no backward graph with nodes")
    for key in ("device_total_bytes", "measured_start_bytes", "step_transient_bytes", "allocator_overhead_bytes",
                "reduce_bucket_bytes", "measured_fwd_bwd_peak_bytes", "accumulation_recv_bytes", "prefetch_bytes",
                "gathered_bytes"):
        if profile.get(key) is not None:
            byte_count(profile[key], f"profile.{key}")
    measured = profile.get("measured_start_bytes")
    first_graph = profile["graphs"][graph_index[order[0]]]
    outside = 0
    if measured is not None and "start_alloc_bytes" in first_graph:
        outside = max(0, first_graph["start_alloc_bytes"] - measured)
    return Profile(nodes, _parse_tasks(profile.get("tasks")), outside, measured,
                   profile.get("step_transient_bytes") or 0, profile.get("reduce_bucket_bytes") or 0,
                   profile.get("measured_fwd_bwd_peak_bytes"), profile.get("accumulation_recv_bytes") or 0,
                   profile.get("prefetch_bytes") or 0, profile.get("gathered_bytes") or 0)


def hold(profile: Profile) -> Profile:
    """Every forward and backward node plus what the composed DeepCompile passes hold (`held_bytes`), so a plan that
    fits the budget under these peaks fits (budget - held) under the nodes alone, and its predicted peak counts
    them. Applied after `calibrate`: the measured step it anchors to ran before those passes (phase 0).
    - prefetch (deepspeed/compile/passes/prefetch.py) moves all-gathers earlier, so parameters are gathered ahead
      of their use, bounded per node by its buffer and by the device's total less that node's profiled peak;
      `prefetch_bytes` is the most it adds at any node, counted at every node;
    - selective gather (selective_gather.py) marks parameters persistent, chosen against the accelerator's free
      memory and the profiled peaks, and allocates their gathered buffers when it runs, kept through every step:
      `gathered_bytes`."""
    if not profile.held_bytes:
        return profile
    return replace(profile, nodes=tuple(replace(node, peak_bytes=node.peak_bytes + profile.held_bytes)
                                        for node in profile.nodes))


def calibrate(profile: Profile) -> Profile:
    """Node peaks as the compiled step reaches them. DeepCompile profiles each graph eagerly, node by node, and
    its readings differ from the compiled step's in four ways:
    - they add what it counts outside the allocator (the same amount at every node): subtracted;
    - a backward node's reading holds every saved activation, where the compiled graph has freed each after its
      last use: backward nodes less their inputs already freed;
    - they miss the reduce buckets, which exist through backward, and with gradient accumulation the receive
      buffer of every micro-batch after an optimizer step's first: added to backward nodes;
    - eager runs materialise what inductor fuses (the loss over the vocabulary most of all), so long sequences
      read high: where a steady step was measured before planning, no forward node counts above its peak. Other
      forward nodes stay as read: moving every node down by the backward's excess put the probe's last layers
      1.6 GB below what the running step held there, and ordered releases planned on that came too late
      (predicted 10.65 GB, measured 11.41; as read, the plan as it ran predicts 11.49).
    The measurement gives the peak's height, not its place: the compiled backward fuses and frees in its own
    order, so its peak can come after the profile's highest node (on GPU, reloads placed right after that node
    came back before the real peak and added their bytes to it). Every backward node then counts at the measured
    peak: a reload during backward is placed, and predicted, as if it lands before the peak."""
    backward_extra = profile.reduce_bucket_bytes + profile.accumulation_recv_bytes
    nodes = tuple(replace(node, peak_bytes=max(0, node.peak_bytes - profile.outside_bytes - node.inputs_freed_bytes
                                                + (backward_extra if node.bwd else 0)))
                  for node in profile.nodes)
    measured = profile.measured_fwd_bwd_peak_bytes
    if measured is not None:
        nodes = tuple(replace(node, peak_bytes=measured if node.bwd else min(node.peak_bytes, measured))
                      for node in nodes)
    return replace(profile, nodes=nodes)


def load_profile(path: str | Path) -> dict:
    """Read and validate profile.json (or a committed campaign's profile.json.gz); a missing, unreadable or
    malformed file is one ConfigError. It is read as harness.contract.safe_read reads a run file: a regular file
    (never a device or a FIFO), of a bounded size, UTF-8 JSON of a bounded depth; a number of thousands of digits is
    no JSON it takes."""
    try:
        text = safe_read.read_text(path, root="/")  # a profile named on the command line may be anywhere
    except OSError as error:
        raise ConfigError("profile", f"cannot read {path}: {error.strerror or error}") from None
    except safe_read.RefusedFile as error:
        raise ConfigError("profile", f"{path}: {error.message}") from None
    try:
        profile = safe_read.parse_json(text, path)
    except safe_read.RefusedFile as error:
        raise ConfigError("profile", f"{path}: {error.message}") from None
    except ValueError as error:
        raise ConfigError("profile", f"{path} is not valid JSON: {str(error)[:200]}") from None
    parse_profile(profile)
    return profile
