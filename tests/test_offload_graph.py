"""CPU tests of the graph pass: where the ops go in synthetic FX graphs (single and multi-graph, re-runs), the
files it writes, and a stock-inductor compile showing the ops run in program order and stay after their anchors."""
from __future__ import annotations

import json
import re

import pytest
import torch
from deepspeed.compile.profilers import ProfilingResult
from torch.fx.experimental.proxy_tensor import make_fx

from harness.offload import ops
from harness.offload.graph_edit import (insert_end_backward, insert_reloads, is_compute_anchor, profiled_node_names,
                                        release_site_names)
from harness.offload.graph_pass import OffloadPass, PlanFiles
from harness.offload.mover import StateMover
from harness.offload.plan import make_plan, read_plan_file
from harness.offload.profile import parse_profile
from harness.offload.runtime import EmptyCachePolicy, OffloadRuntime
from harness.offload.states import discover_tasks
from offload_fakes import FakeDevice, FakeZero3Optimizer, init_deepspeed_on_cpu

ops.register_ops()
TASK_BYTES = {"0:fp32": 24, "0:exp_avg": 24, "0:exp_avg_sq": 24, "1:fp32": 16, "1:exp_avg": 16, "1:exp_avg_sq": 16}
FLOOR = 300


def forward_fn(x, w1, w2):
    h = torch.relu(x @ w1)
    return (h @ w2).sum(), h


def backward_fn(x, h, w1, w2, g):
    gy = g.expand(h.shape[0], w2.shape[1])
    grad_w2 = h.t() @ gy
    grad_h = (gy @ w2.t()) * (h > 0)
    grad_w1 = x.t() @ grad_h
    grad_x = grad_h @ w1.t()
    return grad_x, grad_w1, grad_w2


def traced_graphs():
    x, w1, w2 = torch.randn(4, 8), torch.randn(8, 8), torch.randn(8, 3)
    h = torch.relu(x @ w1)
    return make_fx(forward_fn)(x, w1, w2), make_fx(backward_fn)(x, h, w1, w2, torch.tensor(1.0))


def synthetic_peaks(gm, bwd: bool) -> dict[str, int]:
    """Forward peaks rise to FLOOR; backward peaks fall from FLOOR (activations are freed as backward goes)."""
    names = profiled_node_names(gm.graph)
    steps = range(len(names), 0, -1) if bwd else range(1, len(names) + 1)
    return {name: FLOOR * step // len(names) for name, step in zip(names, steps)}


def profiling_result_for(gm, peaks: dict[str, int], bwd: bool, result: ProfilingResult | None = None):
    result = result or ProfilingResult()
    mem = [(name, peak, 0, peak) for name, peak in peaks.items()]
    if bwd:
        result.bwd_mem = mem
    else:
        result.fwd_mem = mem
    return result


class Harness:
    """One OffloadPass over a fake optimizer, with the DeepCompile calling convention."""

    def __init__(self, tmp_path, budget: int | None, reload: str = "asap", phase: int = 1, release: str = "recorded",
                 cap: int | None = None, budget_rule: str = "deepspeed", accumulation_recv_bytes: int = 0):
        self.optimizer = FakeZero3Optimizer()
        self.device = device = FakeDevice()
        self.runtime = OffloadRuntime(StateMover(device, hold=release == "ordered"), "async",
                                      EmptyCachePolicy("never", device.empty_cache),
                                      reclaim_at_sites=release == "reclaimed")
        self.phase = phase
        self.pass_ = OffloadPass(self.runtime, self.optimizer, budget, reload, PlanFiles(str(tmp_path)),
                                 device_total_bytes=10_000, current_phase=lambda: self.phase,
                                 writes_files=lambda: True, release_policy=release, cap_bytes=cap,
                                 budget_rule=budget_rule, accumulation_recv_bytes=accumulation_recv_bytes)
        self.results: dict[int, ProfilingResult] = {}

    def run(self, gm, graph_id: int, graph_order, bwd: bool, peaks: dict[str, int] | None = None):
        peaks = synthetic_peaks(gm, bwd) if peaks is None else peaks
        self.results[graph_id] = profiling_result_for(gm, peaks, bwd, self.results.get(graph_id))
        args = (gm, graph_id, graph_order, self.results, None, 0.0, None, bwd)
        if not bwd:
            assert self.pass_.evict(*args) is None
        assert self.pass_.plan(*args) is None
        return peaks


def our_ops(graph, kind=None):
    return [node for node in graph.nodes if ops.is_offload_op(node)
            and (kind is None or node.target is ops.op(kind))]


def task_of(node) -> str:
    (task_id,) = ops.REGISTRY.entry(node.args[1]).task_ids
    return task_id


def memory_walk(graph, peaks: dict[str, int], resident_bytes: int) -> int:
    """The step's memory as the inserted graph runs: a node's peak plus every state already on the device."""
    in_use, worst = resident_bytes, 0
    for node in graph.nodes:
        if node.target is ops.op(ops.RELOAD):
            in_use += TASK_BYTES[task_of(node)]
        elif node.name in peaks:
            worst = max(worst, peaks[node.name] + in_use)
    return worst


def read_plan(tmp_path) -> dict:
    return json.loads((tmp_path / "plan.json").read_text())


# ---------------------------------------------------------------- one graph


@pytest.mark.parametrize("budget, reload", [(FLOOR + 58, "asap"), (FLOOR + 58, "at_end"), (1000, "asap"), (0, "asap")])
def test_single_graph_placement_follows_the_plan(tmp_path, budget, reload):
    fwd, bwd = traced_graphs()
    harness = Harness(tmp_path, budget, reload)
    harness.run(fwd, 7, [(7, True)], bwd=False)
    bwd_peaks = harness.run(bwd, 7, [(7, True)], bwd=True)
    plan = read_plan(tmp_path)

    # launches (and the empty-cache op before them) precede the first compute node of the forward graph
    nodes = list(fwd.graph.nodes)
    first_compute = next(i for i, node in enumerate(nodes) if node.op == "call_function" and not ops.is_offload_op(node))
    head = [node.target for node in nodes if ops.is_offload_op(node)]
    assert head == [ops.op(ops.EMPTY_CACHE), ops.op(ops.LAUNCH)]
    assert all(nodes.index(node) < first_compute for node in our_ops(fwd.graph))
    assert ops.REGISTRY.entry(our_ops(fwd.graph, ops.LAUNCH)[0].args[1]).task_ids == tuple(TASK_BYTES)

    # one reload per offloaded task, each at or after the node the plan names, none anchored on an input
    nodes = list(bwd.graph.nodes)
    reloads = our_ops(bwd.graph, ops.RELOAD)
    assert sorted(task_of(node) for node in reloads) == sorted(plan["offloaded"])
    planned_after = {reload["task"]: reload["after_node"] for reload in plan["reloads"]}
    for node in reloads:
        after = next(n for n in nodes if n.name == planned_after[task_of(node)])
        assert nodes.index(node) > nodes.index(after)
        assert is_compute_anchor(node.args[0])
    # the reloads as placed keep the step within what the plan predicts (and within budget if feasible)
    assert memory_walk(bwd.graph, bwd_peaks, plan["resident_bytes"]) <= plan["predicted_peak_bytes"]
    if plan["feasible"]:
        assert plan["predicted_peak_bytes"] <= budget

    # the end-of-backward op comes after the last reload and right before the output
    (end,) = our_ops(bwd.graph, ops.END_BACKWARD)
    assert nodes.index(end) == len(nodes) - 2 and nodes[-1].op == "output"
    assert all(nodes.index(node) < nodes.index(end) for node in reloads)
    # the runtime launches exactly what the plan offloads
    assert harness.runtime.planned == set(plan["offloaded"])


@pytest.mark.parametrize("release", ["ordered", "reclaimed"])
def test_release_sites_free_or_reclaim_each_state_no_later_than_planned(tmp_path, release):
    fwd, bwd = traced_graphs()
    # offload everything; the cap leaves room for all states only at the start of the forward
    harness = Harness(tmp_path, 0, release=release, cap=FLOOR // 2 + sum(TASK_BYTES.values()))
    fwd_peaks = harness.run(fwd, 3, [(3, True)], bwd=False)
    harness.run(bwd, 3, [(3, True)], bwd=True)
    plan = read_plan(tmp_path)
    assert plan["releases"] and plan["release_policy"] == release

    nodes = list(fwd.graph.nodes)
    sites = our_ops(fwd.graph, ops.RELEASE)
    assert len(sites) == len([name for name in fwd_peaks])  # a small graph gets a site before every node
    site_of = {ops.REGISTRY.entry(node.args[1]).site: node for node in sites}
    # each site sits right before its node, after the launch, and is anchored on nothing later than that node
    for site, node in site_of.items():
        name = site.split(":", 1)[1]
        assert nodes[nodes.index(node) + 1].name == name or nodes[nodes.index(node) + 1] in sites
        assert nodes.index(node) > nodes.index(our_ops(fwd.graph, ops.LAUNCH)[0])
        assert nodes.index(node.args[0]) < nodes.index(node)
    # the runtime releases every planned state at the site before the node the plan names
    released = {task: site for site, tasks in harness.runtime.release_sites.items() for task in tasks}
    assert released == {r["task"]: f"0:{r['before_node']}" for r in plan["releases"]}
    assert plan["release_sites"] == {site: list(tasks) for site, tasks in harness.runtime.release_sites.items()}

    # running the ops: ordered, the released states' blocks go in stream order, the rest stay held until their
    # reload; reclaimed, every block went at the launch and each site waits on the host for its states' copies
    ops.bind_runtime(harness.runtime)
    try:
        harness.device.log.clear()
        for node in our_ops(fwd.graph):
            node.target(torch.zeros(1), node.args[1])
        held = {task for task, slot in harness.runtime.slots.items() if slot.held is not None}
        waited = {entry[1] for entry in harness.device.log if entry[0] == "host_wait"}
        if release == "ordered":
            assert held == set(plan["held"]) and held.isdisjoint(released) and not waited
        else:
            assert held == set() == set(plan["held"])
            assert waited == {harness.runtime.slots[task].offload_event.name for task in released}
    finally:
        ops.bind_runtime(None)


def test_release_sites_are_evenly_spaced_and_capped():
    names = [f"n{i}" for i in range(100)]
    sites = release_site_names(names, 8)
    assert len(sites) == 8 and sites[0] == "n0" and sites == sorted(sites, key=names.index)
    gaps = {names.index(b) - names.index(a) for a, b in zip(sites, sites[1:])}
    assert gaps <= {12, 13}
    assert release_site_names(names[:3], 8) == names[:3] and release_site_names([], 8) == []


def test_budget_extremes_offload_all_or_nothing(tmp_path):
    for budget, expected in ((0, set(TASK_BYTES)), (FLOOR + sum(TASK_BYTES.values()), set())):
        fwd, bwd = traced_graphs()
        harness = Harness(tmp_path, budget)
        harness.run(fwd, 1, [(1, True)], bwd=False)
        harness.run(bwd, 1, [(1, True)], bwd=True)
        assert harness.runtime.planned == expected
        assert len(our_ops(bwd.graph, ops.RELOAD)) == len(expected)


def test_asap_reloads_some_states_before_the_end_of_backward(tmp_path):
    fwd, bwd = traced_graphs()
    harness = Harness(tmp_path, FLOOR + 58, "asap")
    harness.run(fwd, 1, [(1, True)], bwd=False)
    harness.run(bwd, 1, [(1, True)], bwd=True)
    nodes = list(bwd.graph.nodes)
    last_compute = max(i for i, node in enumerate(nodes) if is_compute_anchor(node))
    early = [node for node in our_ops(bwd.graph, ops.RELOAD) if nodes.index(node) < last_compute]
    assert early, "with backward peaks falling, asap should reload something before backward ends"


def test_a_reload_planned_after_a_view_is_anchored_on_the_next_computation(tmp_path):
    fwd, bwd = traced_graphs()
    harness = Harness(tmp_path, 0, "asap")
    harness.run(fwd, 1, [(1, True)], bwd=False)
    # make the planner reload right after the first backward node, a view (expand) of an input
    names = profiled_node_names(bwd.graph)
    view_name = names[0]
    assert not is_compute_anchor(next(n for n in bwd.graph.nodes if n.name == view_name))
    harness.pass_.budget_bytes = 10**6
    peaks = {name: (10**6 if name == view_name else 1) for name in names}
    # forward peaks at the budget leave no room for resident states: everything is offloaded
    harness.pass_._builder.add(1, False, [{"name": n, "peak_bytes": 10**6} for n in profiled_node_names(fwd.graph)],
                               True)
    harness.run(bwd, 1, [(1, True)], bwd=True, peaks=peaks)
    placements = read_plan(tmp_path)["placements"]
    assert placements and all(placement["after_node"] == view_name for placement in placements)
    nodes = list(bwd.graph.nodes)
    first_compute = next(node for node in nodes if is_compute_anchor(node))
    assert {placement["anchor"] for placement in placements} == {first_compute.name}
    assert all(nodes.index(node) > nodes.index(first_compute) for node in our_ops(bwd.graph, ops.RELOAD))


_test_library = torch.library.Library("offload_harness_test", "DEF")
_test_library.define("barrier(Tensor x) -> Tensor")
_test_library.impl("barrier", lambda x: x.new_empty(0), "CompositeExplicitAutograd")
_test_library.impl("barrier", lambda x: x.new_empty(0), "Meta")


def test_reloads_prefer_a_barrier_op_over_a_computation(tmp_path):
    """Like DeepSpeed's reduce_grad: anchoring on a barrier's output leaves inductor's fusion alone."""
    def backward_with_barriers(h, w, g):
        grad_w = h.t() @ g
        done_w = torch.ops.offload_harness_test.barrier(grad_w)
        grad_h = torch.relu(g @ w)
        return grad_h, grad_w, done_w

    graph = make_fx(backward_with_barriers)(torch.randn(4, 8), torch.randn(3, 8), torch.randn(4, 3)).graph
    first_mm = next(node for node in graph.nodes if node.target is torch.ops.aten.mm.default)
    assert is_compute_anchor(first_mm)
    entries = [(ops.REGISTRY.add(ops.RELOAD, ("0:fp32",)), "0:fp32", first_mm.name),
               (ops.REGISTRY.add(ops.RELOAD, ("0:exp_avg",)), "0:exp_avg", None)]
    placements = insert_reloads(graph, entries, preferred=frozenset({"offload_harness_test::barrier"}))
    barrier = next(node for node in graph.nodes if node.target is torch.ops.offload_harness_test.barrier.default)
    assert [placement["anchor"] for placement in placements] == [barrier.name, barrier.name]
    nodes = list(graph.nodes)
    reloads = our_ops(graph, ops.RELOAD)
    assert nodes.index(reloads[0]) == nodes.index(barrier) + 1  # right after the barrier
    assert nodes.index(reloads[1]) == len(nodes) - 2            # "at the end": before the output
    assert insert_end_backward(graph, ops.REGISTRY.add(ops.END_BACKWARD),
                               preferred=frozenset({"offload_harness_test::barrier"})).args[0] is barrier


def test_incomplete_profile_plans_as_if_nothing_fits(tmp_path):
    fwd, bwd = traced_graphs()
    harness = Harness(tmp_path, 5_000)
    harness.run(fwd, 1, [(1, True)], bwd=False, peaks={})  # DeepCompile recorded nothing for this graph
    harness.run(bwd, 1, [(1, True)], bwd=True)
    plan = read_plan(tmp_path)
    assert plan["profile_complete"] is False
    assert set(plan["offloaded"]) == set(TASK_BYTES) and not plan["feasible"]


def test_files_match_the_planner_and_key_plans_by_phase_after_a_replan(tmp_path):
    fwd, bwd = traced_graphs()
    harness = Harness(tmp_path, FLOOR + 58)
    harness.run(fwd, 1, [(1, True)], bwd=False)
    harness.run(bwd, 1, [(1, True)], bwd=True)
    profile = json.loads((tmp_path / "profile.json").read_text())
    parse_profile(profile)
    (record,) = read_plan_file((tmp_path / "plan.json").read_text()).values()
    assert record.phase == 1 and record.plan == make_plan(profile, FLOOR + 58)
    assert [task["id"] for task in profile["tasks"]] == list(TASK_BYTES)

    harness.phase = 3  # a later schedule entry re-plans on fresh graphs
    fwd, bwd = traced_graphs()
    harness.run(fwd, 2, [(2, True)], bwd=False)
    harness.run(bwd, 2, [(2, True)], bwd=True)
    assert sorted(read_plan(tmp_path)) == ["1", "3"]
    assert sorted(read_plan_file((tmp_path / "plan.json").read_text())) == [1, 3]


# ---------------------------------------------------------------- graph breaks and re-runs


def test_multi_graph_inserts_each_share_once(tmp_path):
    (fwd0, bwd0), (fwd1, bwd1) = traced_graphs(), traced_graphs()
    harness = Harness(tmp_path, FLOOR + 58)
    order = [(10, True), (11, True)]
    harness.run(fwd0, 10, order[:1], bwd=False)
    harness.run(fwd1, 11, order, bwd=False)
    assert not (tmp_path / "plan.json").exists()
    harness.run(bwd1, 11, order, bwd=True)    # backward runs the last forward graph's backward first
    assert not (tmp_path / "plan.json").exists() and harness.runtime.planned == set()
    harness.run(bwd0, 10, order, bwd=True)
    plan = read_plan(tmp_path)

    assert [node.target for node in our_ops(fwd0.graph)] == [ops.op(ops.EMPTY_CACHE), ops.op(ops.LAUNCH)]
    assert our_ops(fwd1.graph) == []
    assert our_ops(bwd1.graph, ops.END_BACKWARD) == [] and len(our_ops(bwd0.graph, ops.END_BACKWARD)) == 1
    reloaded = [task_of(node) for graph in (bwd1.graph, bwd0.graph) for node in our_ops(graph, ops.RELOAD)]
    assert sorted(reloaded) == sorted(plan["offloaded"])  # every offloaded state exactly once
    assert {p["graph_id"] for p in plan["placements"]} <= {0, 1}
    assert [g["graph_id"] for g in json.loads((tmp_path / "profile.json").read_text())["graphs"]] == [0, 1, 1, 0]


def test_rerunning_the_pass_does_not_double_append(tmp_path):
    fwd, bwd = traced_graphs()
    harness = Harness(tmp_path, FLOOR + 58)
    for _ in range(2):  # the same graphs handed to the pass again
        harness.run(fwd, 1, [(1, True)], bwd=False)
        harness.run(bwd, 1, [(1, True)], bwd=True)
    plan = read_plan(tmp_path)
    assert len(our_ops(fwd.graph)) == 2
    assert len(our_ops(bwd.graph, ops.RELOAD)) == len(plan["offloaded"])
    assert len(our_ops(bwd.graph, ops.END_BACKWARD)) == 1
    assert len(plan["placements"]) == len(plan["offloaded"])
    assert list(harness.runtime.slots) == list(TASK_BYTES)


# ---------------------------------------------------------------- stock inductor on CPU


class RecordingRuntime(OffloadRuntime):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, tuple]] = []

    def run_op(self, entry):
        self.calls.append((entry.kind, entry.task_ids))
        super().run_op(entry)


def _reload_lines(code: str) -> list[tuple[int, str, int]]:
    """(line number, anchor buffer, registry index) of every reload call in inductor's generated code."""
    found = []
    for number, line in enumerate(code.splitlines()):
        match = re.search(rf"{ops.NAMESPACE}\.{ops.RELOAD}\.default\((?:reinterpret_tensor\()?(\w+).*?,\s*(\d+)\)\s*$",
                          line)
        if match:
            found.append((number, match.group(1), int(match.group(2))))
    return found


def compile_with_inductor(tmp_path, runtime, offload_pass) -> tuple[dict[str, list], list[str]]:
    """Three training steps of a small model through stock inductor with our passes run at compile time.
    Returns the ops the passes inserted per graph ("fwd", "bwd") and inductor's generated code."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner
    from torch._inductor.utils import run_and_get_code

    results: dict[int, ProfilingResult] = {}
    graph_id, order = 1, [(1, True)]
    inserted: dict[str, list] = {}

    def inner_compile(gm, example_inputs, **kwargs):
        bwd = bool(kwargs.get("is_backward"))
        results[graph_id] = profiling_result_for(gm, synthetic_peaks(gm, bwd), bwd, results.get(graph_id))
        args = (gm, graph_id, order, results, None, 0.0, None, bwd)
        if not bwd:
            offload_pass.evict(*args)
        offload_pass.plan(*args)
        inserted["bwd" if bwd else "fwd"] = [(node.target, node.args[1]) for node in our_ops(gm.graph)]
        return compile_fx_inner(gm, example_inputs, **kwargs)

    def backend(gm, example_inputs):
        return compile_fx(gm, example_inputs, inner_compile=inner_compile)

    def step_fn(x, w1, w2):
        h = torch.relu(x @ w1)
        return (torch.tanh(h @ w2) * 2).sum()

    x, w1, w2 = torch.randn(16, 32), torch.randn(32, 32, requires_grad=True), torch.randn(32, 8, requires_grad=True)
    compiled = torch.compile(step_fn, backend=backend)

    def one_step():
        loss = compiled(x, w1, w2)
        loss.backward()
        offload_pass.zero_optimizer.step()
        return loss

    ops.bind_runtime(runtime)
    try:
        with inductor_config.patch(force_disable_caches=True):
            _, codes = run_and_get_code(one_step)
        for _ in range(2):
            one_step()
    finally:
        ops.bind_runtime(None)
    return inserted, codes


def assert_program_order_every_step(runtime, inserted: dict[str, list]) -> None:
    program = [(ops.REGISTRY.entry(idx).kind, ops.REGISTRY.entry(idx).task_ids)
               for _, idx in inserted["fwd"] + inserted["bwd"]]
    assert len(runtime.calls) == 3 * len(program)
    for step in range(3):
        assert runtime.calls[step * len(program):(step + 1) * len(program)] == program


@pytest.mark.slow
def test_inductor_keeps_the_ops_in_program_order_after_their_anchors(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
    device = FakeDevice()
    runtime = RecordingRuntime(StateMover(device), "async", EmptyCachePolicy("per_step", device.empty_cache))
    offload_pass = OffloadPass(runtime, FakeZero3Optimizer(), FLOOR + 58, "asap", PlanFiles(str(tmp_path)), 10_000,
                               current_phase=lambda: 1, writes_files=lambda: True)
    inserted, codes = compile_with_inductor(tmp_path, runtime, offload_pass)
    plan = read_plan(tmp_path)
    assert plan["reloads"], "the test needs a plan that reloads something"

    # program order, every step: empty cache, launch, the reloads as inserted, end of backward
    assert_program_order_every_step(runtime, inserted)
    assert runtime.fallback_reloads == len(TASK_BYTES) - len(plan["offloaded"])  # compile step only

    # generated code: launch before the forward's first kernel; each reload after the kernel that computes its
    # anchor (an intermediate buffer, not an input); end of backward after the last reload
    forward_code, backward_code = codes[0], codes[-1]
    fwd_lines = forward_code.splitlines()
    fwd_call = next(i for i, line in enumerate(fwd_lines) if "def call(" in line)
    launch_line = next(i for i, line in enumerate(fwd_lines) if f"{ops.NAMESPACE}.{ops.LAUNCH}" in line)
    first_kernel = next(i for i, line in enumerate(fwd_lines[fwd_call:], start=fwd_call)
                        if re.match(r"\s*(extern_kernels\.\w+|cpp_fused_\w+|triton_\w+\.run)\(", line))
    assert fwd_call < launch_line < first_kernel
    bwd_lines = backward_code.splitlines()
    call_start = next(i for i, line in enumerate(bwd_lines) if "def call(" in line)
    reloads = _reload_lines(backward_code)
    assert [ops.REGISTRY.entry(idx).task_ids[0] for _, _, idx in reloads] == \
        [ops.REGISTRY.entry(idx).task_ids[0] for target, idx in inserted["bwd"] if target is ops.op(ops.RELOAD)]
    inputs_line = next(line for line in bwd_lines[call_start:] if "= args" in line)
    for number, buffer, _ in reloads:
        assert buffer.startswith("buf") and buffer not in inputs_line
        writers = [i for i, line in enumerate(bwd_lines[call_start:number], start=call_start)
                   if re.search(rf"\b{buffer}\b", line) and "empty_strided" not in line and "del " not in line]
        assert writers, f"no kernel computes {buffer} before the reload that reads it"
    end_line = next(i for i, line in enumerate(bwd_lines) if f"{ops.NAMESPACE}.{ops.END_BACKWARD}" in line)
    assert all(number < end_line for number, _, _ in reloads)


@pytest.mark.slow
def test_inductor_runs_the_release_sites_in_program_order_and_frees_the_planned_states(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
    device = FakeDevice()
    runtime = RecordingRuntime(StateMover(device, hold=True), "async", EmptyCachePolicy("never", device.empty_cache))
    offload_pass = OffloadPass(runtime, FakeZero3Optimizer(), 0, "asap", PlanFiles(str(tmp_path)), 10_000,
                               current_phase=lambda: 1, writes_files=lambda: True, release_policy="ordered",
                               cap_bytes=FLOOR // 2 + sum(TASK_BYTES.values()))
    inserted, codes = compile_with_inductor(tmp_path, runtime, offload_pass)
    plan = read_plan(tmp_path)
    assert plan["releases"] and plan["release_sites"], "the test needs a plan that releases something"
    assert_program_order_every_step(runtime, inserted)
    # every release op inserted in the forward survives inductor and runs, after the launch
    forward_code = codes[0]
    release_lines = [i for i, line in enumerate(forward_code.splitlines())
                     if f"{ops.NAMESPACE}.{ops.RELEASE}" in line]
    launch_line = next(i for i, line in enumerate(forward_code.splitlines())
                       if f"{ops.NAMESPACE}.{ops.LAUNCH}" in line)
    assert len(release_lines) == sum(target is ops.op(ops.RELEASE) for target, _ in inserted["fwd"]) > 0
    assert all(line > launch_line for line in release_lines)
    # after three steps nothing is left held or on the host: the released states were copied back, the held
    # ones pointed back at their blocks
    assert all(slot.held is None and not slot.on_host for slot in runtime.slots.values())


# ---------------------------------------------------------------- the schedule


def test_schedule_satisfies_deepspeed_contracts_and_registers_both_passes(tmp_path, monkeypatch):
    from deepspeed.compile.passes import zero3_compile
    from deepspeed.compile.passes.contract import PassContractError, register_pass_contract, validate_schedule

    import harness.offload as harness_offload
    from harness.offload import schedule

    registered = {}
    engine = type("Engine", (), {"register_compile_pass": lambda self, name, fn, contract: (
        registered.__setitem__(name, fn), register_pass_contract(name, contract))})()
    harness = Harness(tmp_path, FLOOR + 58)
    schedule.register_passes(engine, harness.pass_)
    register_pass_contract(zero3_compile.NAME, zero3_compile.CONTRACT)  # the engine registers it on GPU machines
    registry = {**registered, zero3_compile.NAME: zero3_compile.add_z3_gather_release}

    plan = schedule.build_schedule()
    assert schedule.GATHER_RELEASE_PASS == zero3_compile.NAME
    assert [step for step, _ in plan] == [0, schedule.PLANNING_STEP]
    validate_schedule(plan, registry)
    with pytest.raises(PassContractError):  # planning without a prior eviction is refused
        validate_schedule([(1, [zero3_compile.NAME, schedule.PLAN_PASS])], registry)
    assert [schedule.phase_at(plan, step) for step in range(4)] == [0, 0, 1, 1]  # step 1: a measured phase-0 step

    fwd, bwd = traced_graphs()
    harness.run(fwd, 1, [(1, True)], bwd=False)
    harness.run(bwd, 1, [(1, True)], bwd=True)
    monkeypatch.setattr(harness_offload, "_installed", None)
    assert harness_offload.plan_facts() == {}
    monkeypatch.setattr(harness_offload, "_installed", harness.pass_)
    plan = read_plan(tmp_path)
    assert harness_offload.plan_facts() == {"planned_offload_bytes": plan["offloaded_bytes"],
                                            "predicted_peak_bytes": plan["predicted_peak_bytes"],
                                            "budget_bytes": plan["budget_bytes"]}


def test_deepspeed_runs_our_passes_with_its_own_calling_convention(tmp_path, monkeypatch):
    """DeepSpeed's run_opt_passes (what make_fw_graph/make_bw_graph call) drives both passes; they change the
    graph in place and return None, so DeepSpeed neither re-profiles nor replaces the graph."""
    from deepspeed.compile.backend import run_opt_passes

    init_deepspeed_on_cpu(monkeypatch)
    fwd, bwd = traced_graphs()
    harness = Harness(tmp_path, FLOOR + 58)
    results = {5: profiling_result_for(fwd, synthetic_peaks(fwd, False), False)}
    profiling_result_for(bwd, synthetic_peaks(bwd, True), True, results[5])
    fwd_graph, bwd_graph = fwd.graph, bwd.graph
    for gm, is_bwd in ((fwd, False), (bwd, True)):
        run_opt_passes(opt_passes=[harness.pass_.evict, harness.pass_.plan], gm=gm, graph_id=5,
                       graph_order=[(5, True)], profiling_results=results, create_inputs_fn=lambda: (),
                       mem_budget=0.0, param_manager=None, bwd=is_bwd)
    assert fwd.graph is fwd_graph and bwd.graph is bwd_graph
    assert len(our_ops(fwd.graph, ops.LAUNCH)) == 1 and len(our_ops(bwd.graph, ops.END_BACKWARD)) == 1
    assert all(slot.on_host for slot in harness.runtime.slots.values())  # evicted before profiling
    assert "ops.offload_harness.launch_offloads" in fwd.code  # recompiled: the eager backend runs gm.forward
    assert harness.runtime.planned == set(read_plan(tmp_path)["offloaded"])


def test_a_backward_graph_handed_to_the_pass_again_keeps_its_reloads(tmp_path):
    fwd, bwd = traced_graphs()
    harness = Harness(tmp_path, 0)  # everything offloaded
    harness.run(fwd, 1, [(1, True)], bwd=False)
    harness.run(bwd, 1, [(1, True)], bwd=True)
    harness.run(bwd, 1, [(1, True)], bwd=True)
    assert sorted(task_of(node) for node in our_ops(bwd.graph, ops.RELOAD)) == sorted(TASK_BYTES)
    assert len(read_plan(tmp_path)["placements"]) == len(TASK_BYTES)


OVERHEAD = 300  # what the fake allocator holds beyond live bytes once the cache is emptied
DEVICE_LIMIT = 10_000 - OVERHEAD - max(TASK_BYTES.values())  # room kept for the largest single request too


@pytest.mark.parametrize("budget, budget_rule, rule, planned_against", [
    (5_000, "deepspeed", "budget", 5_000),
    (5_000, "step_model", "step_model", 5_000),
    (9_999, "step_model", "step_model", DEVICE_LIMIT),  # the device less the overhead binds, not the budget
    (None, "deepspeed", "device_limit", DEVICE_LIMIT),  # no budget: the device rule, whatever the budget rule
])
def test_the_budget_rule_picks_the_planner_and_the_limit_it_plans_against(tmp_path, budget, budget_rule, rule,
                                                                          planned_against):
    fwd, bwd = traced_graphs()
    harness = Harness(tmp_path, budget, budget_rule=budget_rule)
    harness.device.reserved, harness.device.allocated = OVERHEAD, 0
    harness.run(fwd, 1, [(1, True)], bwd=False)
    harness.run(bwd, 1, [(1, True)], bwd=True)
    plan = read_plan(tmp_path)
    assert plan["rule"] == rule and plan["budget_bytes"] == planned_against


def test_the_steady_step_before_planning_gives_the_measured_peak_and_the_optimizer_transient(tmp_path):
    harness = Harness(tmp_path, budget=10_000)
    pass_, runtime = harness.pass_, harness.runtime
    runtime.adopt(discover_tasks(harness.optimizer))  # sub-groups of 72 and 48 state bytes
    runtime.forward_start_bytes = 1000
    pass_.observe_step({"phase_step": 0, "fwd_bwd_peak_allocated_bytes": 9, "opt_step_peak_allocated_bytes": 9})
    facts = pass_._step_facts()  # a compile step measures the profiler, not the step: ignored
    assert "measured_fwd_bwd_peak_bytes" not in facts and facts["step_transient_bytes"] == 24  # one fp32 gradient
    runtime.out_until_plan = True  # evict_from=start: the states are out but each sub-group's at its own update
    pass_.observe_step({"phase_step": 1, "fwd_bwd_peak_allocated_bytes": 5000, "opt_step_peak_allocated_bytes": 1102})
    facts = pass_._step_facts()
    assert facts["measured_fwd_bwd_peak_bytes"] == 5000 and facts["step_transient_bytes"] == 1102 - 1000 - 72
    runtime.out_until_plan = False  # evict_from=planning_step: every state on the device through the step
    pass_.observe_step({"phase_step": 2, "fwd_bwd_peak_allocated_bytes": 5000, "opt_step_peak_allocated_bytes": 1150})
    facts = pass_._step_facts()
    assert facts["measured_fwd_bwd_peak_bytes"] == 5000 - 120 and facts["step_transient_bytes"] == 1150 - 1000 - 120
    assert facts["allocator_overhead_bytes"] is None  # a budget was given: the device rule measured nothing
    pass_._overhead_bytes, pass_.reduce_buckets = 10, (2 * 30, 30)  # after emptying the cache; two buckets
    assert pass_._step_facts()["allocator_overhead_bytes"] == 10 + 30
    pass_.reduce_buckets = (2 * 5, 5)
    assert pass_._step_facts()["allocator_overhead_bytes"] == 10 + 24  # the largest state is the largest request
    pass_.last_plan = {"offloaded_bytes": 0}  # once planned, later steps run the plan: not the model's input
    pass_.observe_step({"phase_step": 3, "fwd_bwd_peak_allocated_bytes": 1, "opt_step_peak_allocated_bytes": 1})
    assert pass_._step_facts()["measured_fwd_bwd_peak_bytes"] == 5000 - 120


@pytest.mark.parametrize("recv_bytes", [0, 700])
def test_accumulations_receive_buffer_reaches_the_profile_and_the_plans_backward(tmp_path, recv_bytes):
    fwd, bwd = traced_graphs()
    harness = Harness(tmp_path, 10_000, accumulation_recv_bytes=recv_bytes)
    harness.run(fwd, 1, [(1, True)], bwd=False)
    peaks = harness.run(bwd, 1, [(1, True)], bwd=True)
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile.get("accumulation_recv_bytes") == (recv_bytes or None)  # absent without accumulation
    backward = [node.peak_bytes for node in parse_profile(profile).nodes if node.bwd]
    assert max(backward) == max(peaks.values()) + recv_bytes
