"""CPU tests of our pass composed with DeepCompile's prefetch and selective gather (`offload.compose`): the schedule
DeepCompile validates against the passes' contracts, and the plan pass planning on the readings from before those
passes while counting what they hold (graph_pass.OffloadPass.before_compose, profile.hold)."""
from __future__ import annotations

import json

import pytest
from deepspeed.compile.passes import contract, prefetch, selective_gather, zero3_compile

from harness.offload import schedule
from harness.offload.graph_pass import OffloadPass, PlanFiles
from harness.offload.mover import StateMover
from harness.offload.plan import make_plan, read_plan_file
from harness.offload.profile_builder import readings_before
from harness.offload.runtime import EmptyCachePolicy, OffloadRuntime
from offload_fakes import FakeDevice, FakeZero3Optimizer
from test_offload_graph import profiling_result_for, synthetic_peaks, traced_graphs


def register_contracts() -> None:
    for name, pass_contract in ((zero3_compile.NAME, zero3_compile.CONTRACT), (prefetch.NAME, prefetch.CONTRACT),
                                (selective_gather.NAME, selective_gather.CONTRACT),
                                (schedule.EVICT_PASS, schedule.EVICT_CONTRACT),
                                (schedule.SNAPSHOT_PASS, schedule.SNAPSHOT_CONTRACT),
                                (schedule.PLAN_PASS, schedule.PLAN_CONTRACT)):
        contract.register_pass_contract(name, pass_contract)


@pytest.mark.parametrize("compose", list(schedule.COMPOSED_PASSES))
def test_the_planning_entry_runs_deepcompiles_passes_between_gather_release_and_our_plan(compose):
    register_contracts()
    built = schedule.build_schedule(compose)
    contract.validate_schedule(built)  # raises on an unmet requirement or a conflict
    (start, passes), (planning_step, planning) = built
    assert (start, passes, planning_step) == (0, [schedule.GATHER_RELEASE_PASS], schedule.PLANNING_STEP)
    composed = {"none": [], "prefetch": [prefetch.NAME],
                "prefetch_selective_gather": [prefetch.NAME, selective_gather.NAME]}[compose]
    snapshot = [schedule.SNAPSHOT_PASS] if composed else []
    assert planning == [schedule.EVICT_PASS, schedule.GATHER_RELEASE_PASS, *snapshot, *composed, schedule.PLAN_PASS]


def test_deepcompiles_passes_before_gather_release_are_refused():
    """The contracts the schedule relies on: prefetch reorders gather/release's all-gathers."""
    register_contracts()
    with pytest.raises(contract.PassContractError):
        contract.validate_schedule([(0, [prefetch.NAME, schedule.GATHER_RELEASE_PASS])])


def test_a_node_the_earlier_profile_lacks_reads_as_the_node_before_it():
    before = [("x", 10, 0, 10), ("mm", 40, 30, 55), ("relu", 45, 5, 60)]
    filled = readings_before(["mm", "prefetch_params_fused", "relu", "prefetch_params_fused_1"], before)
    assert filled == before + [("prefetch_params_fused", 40, 0, 55), ("prefetch_params_fused_1", 45, 0, 60)]


def composed_pass(tmp_path, compose: str, device: FakeDevice, budget: int) -> OffloadPass:
    """`device.allocated` is what the allocator reads: selective gather allocates its buffers when it runs."""
    runtime = OffloadRuntime(StateMover(device), "async", EmptyCachePolicy("never", device.empty_cache))
    return OffloadPass(runtime, FakeZero3Optimizer(), budget, "asap", PlanFiles(str(tmp_path)),
                       device_total_bytes=10_000, current_phase=lambda: 1, writes_files=lambda: True,
                       compose=compose)


def run_graph(offload_pass: OffloadPass, results: dict, gm, bwd: bool, before: dict, after: dict,
              composed_pass_runs=lambda: None) -> None:
    """DeepCompile's order in the planning entry: (evict,) gather/release profiled `before`; our snapshot; the
    composed passes, after which DeepCompile re-profiles (`after`); our plan."""
    order = [(7, True)]
    results[7] = profiling_result_for(gm, before, bwd, results.get(7))
    args = (gm, 7, order, results, None, 0.0, None, bwd)
    if not bwd:
        offload_pass.evict(*args)
    offload_pass.before_compose(*args)
    composed_pass_runs()
    results[7] = profiling_result_for(gm, after, bwd, results[7])
    offload_pass.plan(*args)


@pytest.mark.parametrize("compose", ["prefetch", "prefetch_selective_gather"])
def test_the_plan_counts_what_prefetch_and_selective_gather_hold(tmp_path, compose):
    fwd, bwd = traced_graphs()
    fwd_before, bwd_before = synthetic_peaks(fwd, bwd=False), synthetic_peaks(bwd, bwd=True)
    gathers = compose == "prefetch_selective_gather"
    gathered = 30 if gathers else 0
    device, budget = FakeDevice(), 330
    device.allocated = 1_000
    offload_pass, results = composed_pass(tmp_path, compose, device, budget), {}

    def selective_gather_runs():
        device.allocated += gathered

    # prefetch raises forward's profiled peak by 40 and backward's by 10; the gathered buffers show in backward
    run_graph(offload_pass, results, fwd, False, fwd_before, {name: peak + 40 for name, peak in fwd_before.items()})
    run_graph(offload_pass, results, bwd, True, bwd_before,
              {name: peak + 10 + gathered for name, peak in bwd_before.items()}, selective_gather_runs)

    profile = json.loads((tmp_path / "profile.json").read_text())
    assert (profile["prefetch_bytes"], profile["gathered_bytes"]) == (40, gathered)
    recorded = {node["name"]: node["peak_bytes"] for graph in profile["graphs"] for node in graph["nodes"]}
    assert recorded == {**fwd_before, **bwd_before}  # planned on the readings without the composed passes
    [record] = read_plan_file((tmp_path / "plan.json").read_text()).values()
    plan = record.plan
    assert plan == make_plan(profile, budget)
    alone = make_plan({key: value for key, value in profile.items()
                       if key not in ("prefetch_bytes", "gathered_bytes")}, budget - 40 - gathered)
    assert plan.offloaded == alone.offloaded and plan.offloaded_bytes > 0


def test_without_composition_the_profile_has_no_held_bytes(tmp_path):
    fwd, bwd = traced_graphs()
    offload_pass, results = composed_pass(tmp_path, "none", FakeDevice(), 330), {}
    for gm, is_bwd in ((fwd, False), (bwd, True)):
        peaks = synthetic_peaks(gm, is_bwd)
        results[7] = profiling_result_for(gm, peaks, is_bwd, results.get(7))
        args = (gm, 7, [(7, True)], results, None, 0.0, None, is_bwd)
        if not is_bwd:
            offload_pass.evict(*args)
        offload_pass.plan(*args)
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert "prefetch_bytes" not in profile and "gathered_bytes" not in profile
