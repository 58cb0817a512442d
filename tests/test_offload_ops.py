"""CPU tests of the offload runtime: op registration, the registry, task discovery, the mover's stream discipline,
the runtime's modes and empty_cache policies, the config check, and a ZeRO-3 round trip on DeepSpeed's CPU path."""
from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.fx

from harness.contract.errors import ConfigError
from harness.offload import check_config, counters, ops
from harness.offload.accumulation import EngineMicroBatches, WholeSteps
from harness.offload.mover import StateMover
from harness.offload.runtime import EmptyCachePolicy, OffloadRuntime
from harness.offload.states import SubGroupGate, discover_tasks
from offload_fakes import FakeAccumulatingEngine, FakeDevice, FakeZero3Optimizer, init_deepspeed_on_cpu

ops.register_ops()


def make_runtime(optimizer, mode="async", empty_cache="never", streams="split", profiling=lambda: False,
                 hold=False, micro_batches=WholeSteps(), copy_delay_us=0, reclaim=False, launch_after_update=False):
    device = FakeDevice()
    mover = StateMover(device, split_streams=streams == "split", hold=hold, copy_delay_us=copy_delay_us)
    runtime = OffloadRuntime(mover, mode, EmptyCachePolicy(empty_cache, device.empty_cache), profiling, micro_batches,
                             reclaim_at_sites=reclaim, launch_after_update=launch_after_update)
    runtime.adopt(discover_tasks(optimizer))
    return runtime, device


@pytest.fixture
def bound():
    """Bind a runtime for the test and unbind it afterwards (the ops are process-global)."""
    runtimes = []

    def bind(runtime):
        runtimes.append(runtime)
        ops.bind_runtime(runtime)
        return runtime

    yield bind
    ops.bind_runtime(None)


def call(kind, task_ids=()):
    ops.op(kind)(torch.zeros(1), ops.REGISTRY.add(kind, task_ids))


# ---------------------------------------------------------------- ops


@pytest.mark.parametrize("kind", ops.OP_NAMES)
def test_ops_are_registered_ordered_and_side_effectful(kind):
    overload = ops.op(kind)
    assert str(overload._schema) == f"{ops.NAMESPACE}::{kind}(Tensor anchor, int idx) -> ()"
    assert ops.effect_of(overload).name == "ORDERED"
    assert overload in torch.fx.node._side_effectful_functions


def test_ops_survive_fx_dead_code_elimination():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.call_function(ops.op(ops.RELOAD), (x, 0))
    graph.output(x)
    graph.eliminate_dead_code()
    assert sum(ops.is_offload_op(node) for node in graph.nodes) == 1


def test_meta_kernel_does_not_reach_the_runtime(bound):
    seen = []
    bound(type("Recorder", (), {"run_op": lambda self, entry: seen.append(entry)})())
    ops.op(ops.LAUNCH)(torch.empty(3, device="meta"), ops.REGISTRY.add(ops.LAUNCH, ("0:fp32",)))
    assert seen == []
    call(ops.LAUNCH, ("0:fp32",))
    assert [entry.task_ids for entry in seen] == [("0:fp32",)]


def test_op_with_a_mismatched_index_or_no_runtime_fails_loudly(bound):
    bound(type("Recorder", (), {"run_op": lambda self, entry: None})())
    reload_index = ops.REGISTRY.add(ops.RELOAD, ("0:fp32",))
    with pytest.raises(RuntimeError, match="holds a reload_state op"):
        ops.op(ops.LAUNCH)(torch.zeros(1), reload_index)
    ops.bind_runtime(None)
    with pytest.raises(RuntimeError, match="no offload runtime bound"):
        ops.op(ops.RELOAD)(torch.zeros(1), reload_index)


# ---------------------------------------------------------------- tasks


def test_discover_tasks_lists_each_sub_group_in_step_order():
    optimizer = FakeZero3Optimizer(sub_group_numels=(6, 4))
    tasks = discover_tasks(optimizer)
    assert [task.id for task in tasks] == ["0:fp32", "0:exp_avg", "0:exp_avg_sq", "1:fp32", "1:exp_avg", "1:exp_avg_sq"]
    assert [task.nbytes for task in tasks] == [24, 24, 24, 16, 16, 16]


def test_discover_tasks_skips_views_and_scalars():
    optimizer = FakeZero3Optimizer(sub_group_numels=(6,))
    # fp32 training: the master partition is a view of the model's flat buffer and must stay put
    backing = torch.zeros(10)
    view = backing.narrow(0, 0, 6)
    optimizer.optimizer.state = {view: optimizer.optimizer.state[optimizer.fp32_partitioned_groups_flat[0]]}
    optimizer.fp32_partitioned_groups_flat = [view]
    assert [task.id for task in discover_tasks(optimizer)] == ["0:exp_avg", "0:exp_avg_sq"]


# ---------------------------------------------------------------- mover


def test_round_trip_restores_values_and_keeps_tensor_objects():
    optimizer = FakeZero3Optimizer()
    runtime, device = make_runtime(optimizer)
    before = optimizer.snapshot()
    objects = [id(task.tensor) for task in discover_tasks(optimizer)]
    runtime.evict_all()
    assert all(slot.on_host for slot in runtime.slots.values())
    for slot in runtime.slots.values():
        runtime.mover.reload(slot)
    assert not any(slot.on_host for slot in runtime.slots.values())
    assert [id(task.tensor) for task in discover_tasks(optimizer)] == objects
    assert all(torch.equal(a, b) for a, b in zip(before, optimizer.snapshot()))


def test_pinned_buffers_are_allocated_once_per_state():
    optimizer = FakeZero3Optimizer()
    runtime, device = make_runtime(optimizer)
    for _ in range(3):
        runtime.mover.offload(runtime.slots.values())
        for slot in runtime.slots.values():
            runtime.mover.reload(slot)
    assert device.pinned_allocations == len(runtime.slots)


def test_offload_waits_for_compute_and_ties_the_freed_block_to_the_copy_stream():
    optimizer = FakeZero3Optimizer(sub_group_numels=(6,))
    runtime, device = make_runtime(optimizer)
    runtime.mover.offload(runtime.slots.values())
    d2h = runtime.mover.d2h.name
    assert device.log[0] == ("wait_stream", d2h, "compute")
    assert [entry for entry in device.log if entry[0] == "record_stream"] == [("record_stream", d2h, 6)] * 3


def test_reload_allocates_on_compute_and_waits_only_for_its_own_offload():
    optimizer = FakeZero3Optimizer(sub_group_numels=(6,))
    runtime, device = make_runtime(optimizer)
    runtime.mover.offload(runtime.slots.values())
    slot = runtime.slots["0:exp_avg"]
    device.log.clear()
    runtime.mover.reload(slot)
    h2d = runtime.mover.h2d.name
    assert device.log[:3] == [("allocate", "compute", 6), ("wait_stream", h2d, "compute"),
                              ("wait_event", h2d, slot.offload_event.name)]
    assert not any(entry[0] == "record_stream" for entry in device.log)  # no delayed frees for reload buffers
    assert slot.reload_unwaited


@pytest.mark.parametrize("streams, shared", [("split", False), ("single", True)])
def test_streams_knob(streams, shared):
    runtime, _ = make_runtime(FakeZero3Optimizer(), streams=streams)
    assert (runtime.mover.d2h is runtime.mover.h2d) is shared


def test_offload_of_an_unwaited_reload_waits_for_it_first():
    runtime, device = make_runtime(FakeZero3Optimizer(sub_group_numels=(6,)))
    slot = runtime.slots["0:fp32"]
    runtime.mover.offload([slot])
    runtime.mover.reload(slot)  # e.g. a skipped optimizer step: the compute stream never waited
    device.log.clear()
    runtime.mover.offload([slot])
    assert ("wait_event", runtime.mover.d2h.name, slot.reload_event.name) in device.log


def test_hold_keeps_the_block_until_release_makes_compute_wait_for_its_copy():
    runtime, device = make_runtime(FakeZero3Optimizer(sub_group_numels=(6,)), hold=True)
    slot = runtime.slots["0:exp_avg"]
    runtime.mover.offload([slot])
    assert slot.on_host and slot.held is not None
    assert not any(entry[0] == "record_stream" for entry in device.log)  # freed in stream order instead
    device.log.clear()
    assert runtime.mover.release(slot) and slot.held is None
    assert device.log == [("wait_event", "compute", slot.offload_event.name)]
    assert not runtime.mover.release(slot)  # nothing left to release


def test_reload_of_a_held_state_points_it_back_at_its_block_without_a_copy():
    optimizer = FakeZero3Optimizer(sub_group_numels=(6,))
    runtime, device = make_runtime(optimizer, hold=True)
    before = optimizer.snapshot()
    slot = runtime.slots["0:fp32"]
    block = slot.task.tensor.data_ptr()
    runtime.mover.offload([slot])
    device.log.clear()
    assert not runtime.mover.reload(slot)  # no copy started
    assert slot.task.tensor.data_ptr() == block and slot.held is None and not slot.on_host
    # the optimizer will write the block, so the compute stream waits for the copy that reads it
    assert device.log == [("wait_event", "compute", slot.offload_event.name)]
    assert all(torch.equal(a, b) for a, b in zip(before, optimizer.snapshot()))


def test_evict_all_also_frees_blocks_still_held():
    runtime, device = make_runtime(FakeZero3Optimizer(sub_group_numels=(6,)), hold=True)
    runtime.mover.offload(runtime.slots.values())
    assert all(slot.held is not None for slot in runtime.slots.values())
    runtime.evict_all()
    assert all(slot.held is None and slot.on_host for slot in runtime.slots.values())


# ---------------------------------------------------------------- runtime


def plan_all(runtime, offloaded):
    runtime.begin_phase()
    runtime.finalize_plan(offloaded)


def test_release_op_frees_the_states_the_plan_assigned_to_its_site(bound):
    optimizer = FakeZero3Optimizer()
    runtime, device = make_runtime(optimizer, hold=True)
    bound(runtime)
    runtime.begin_phase()
    runtime.finalize_plan(["0:fp32", "0:exp_avg", "1:fp32"], {"0:mm0": ("0:fp32", "0:exp_avg")})
    call(ops.LAUNCH, tuple(runtime.slots))
    ops.op(ops.RELEASE)(torch.zeros(1), ops.REGISTRY.add(ops.RELEASE, site="0:mm0"))
    ops.op(ops.RELEASE)(torch.zeros(1), ops.REGISTRY.add(ops.RELEASE, site="0:other"))  # nothing assigned
    held = {task_id for task_id, slot in runtime.slots.items() if slot.held is not None}
    assert held == {"1:fp32"}
    start = counters()
    for task_id in ("0:fp32", "0:exp_avg", "1:fp32"):
        call(ops.RELOAD, (task_id,))
    call(ops.END_BACKWARD)
    # the two released states are copied back; the held one is pointed back at its block
    assert counters()["reloads"] - start["reloads"] == 2
    assert not any(slot.on_host for slot in runtime.slots.values()) and runtime.fallback_reloads == 0


def test_reclaimed_release_site_waits_on_the_host_for_its_states_copies_and_holds_nothing(bound):
    """release=reclaimed: the blocks go back at the launch (record_stream), and a site waits on the host for the
    copies of the states assigned to it, no other: the allocator then finds those blocks free at its next request."""
    runtime, device = make_runtime(FakeZero3Optimizer(), reclaim=True)
    bound(runtime)
    runtime.begin_phase()
    runtime.finalize_plan(["0:fp32", "0:exp_avg", "1:fp32"], {"0:mm0": ("0:fp32",)})
    call(ops.LAUNCH, tuple(runtime.slots))
    assert sum(entry[0] == "record_stream" for entry in device.log) == 3
    assert all(slot.held is None for slot in runtime.slots.values())
    device.log.clear()
    before = runtime.mover.timer.totals["reclaim_wait_s"]
    ops.op(ops.RELEASE)(torch.zeros(1), ops.REGISTRY.add(ops.RELEASE, site="0:mm0"))
    assert device.log == [("host_wait", runtime.slots["0:fp32"].offload_event.name)]
    assert runtime.mover.timer.totals["reclaim_wait_s"] > before
    assert runtime.mover.timer.totals["offload_stall_s"] == 0  # the device had the forward queued: no stall
    start = counters()
    for task_id in ("0:fp32", "0:exp_avg", "1:fp32"):
        call(ops.RELOAD, (task_id,))
    call(ops.END_BACKWARD)
    assert counters()["reloads"] - start["reloads"] == 3  # every state copied back: none was held
    assert runtime.fallback_reloads == 0


def test_reclaim_waits_for_nothing_where_the_state_is_on_the_device():
    runtime, device = make_runtime(FakeZero3Optimizer(sub_group_numels=(6,)), reclaim=True)
    slot = runtime.slots["0:fp32"]
    assert not runtime.mover.reclaim(slot) and device.log == []  # never offloaded
    runtime.mover.offload([slot])
    runtime.mover.reload(slot)
    device.log.clear()
    assert not runtime.mover.reclaim(slot) and device.log == []  # back on the device


def gated_runtime(bound, **knobs):
    """A bound runtime whose optimizer's sub-groups each wait for their own states (as install() sets it up)."""
    optimizer = FakeZero3Optimizer()
    runtime, device = make_runtime(optimizer, **knobs)
    bound(runtime)
    SubGroupGate(optimizer, runtime.before_sub_group_step, runtime.after_sub_group_step).install()
    runtime.gated = True
    return optimizer, runtime, device


def test_evict_from_start_keeps_states_on_the_host_between_updates_until_the_first_plan(bound):
    """offload.evict_from=start: phase 0 holds no state on the device except the sub-group being updated; the
    updates land in the states all the same, and once a plan is armed the states stay after their update."""
    optimizer, runtime, device = gated_runtime(bound)
    expected = [tensor + 1.0 for tensor in optimizer.snapshot()]
    moved = runtime.evict_from_start(lambda: discover_tasks(optimizer))
    assert moved == sum(slot.task.nbytes for slot in runtime.slots.values())
    assert all(slot.on_host for slot in runtime.slots.values())
    on_device_during_update = []
    prepare = optimizer._prepare_sub_group

    def watch(sub_group_id, timer_names):
        prepare(sub_group_id, timer_names)
        on_device_during_update.append(sorted(s.task.id for s in runtime.slots.values() if not s.on_host))

    optimizer._prepare_sub_group = watch
    optimizer.step()
    assert on_device_during_update == [["0:exp_avg", "0:exp_avg_sq", "0:fp32"], ["1:exp_avg", "1:exp_avg_sq", "1:fp32"]]
    assert all(slot.on_host for slot in runtime.slots.values())
    assert all(torch.equal(a, b) for a, b in zip(optimizer.snapshot(), expected))
    plan_all(runtime, [])
    optimizer.step()
    assert not any(slot.on_host for slot in runtime.slots.values())
    assert all(torch.equal(a, b + 1.0) for a, b in zip(optimizer.snapshot(), expected))


def test_async_step_moves_only_planned_states_and_counts_them(bound):
    optimizer, runtime, device = gated_runtime(bound)
    all_ids = tuple(runtime.slots)
    plan_all(runtime, ["1:fp32", "1:exp_avg", "1:exp_avg_sq"])
    start = counters()
    call(ops.LAUNCH, all_ids)
    assert [slot.task.id for slot in runtime.slots.values() if slot.on_host] == ["1:fp32", "1:exp_avg", "1:exp_avg_sq"]
    for task_id in ["1:fp32", "1:exp_avg", "1:exp_avg_sq"]:
        call(ops.RELOAD, (task_id,))
    call(ops.END_BACKWARD)
    end = counters()
    assert end["offload_launches"] - start["offload_launches"] == 3
    assert end["reloads"] - start["reloads"] == 3
    assert end["offload_bytes"] - start["offload_bytes"] == 3 * 16
    assert end["reload_bytes"] - start["reload_bytes"] == 3 * 16
    assert runtime.fallback_reloads == 0


def offload_all_and_end_backward(runtime, device) -> None:
    """A step that offloads and reloads every state; the device log keeps only what the end of backward did."""
    plan_all(runtime, list(runtime.slots))
    call(ops.LAUNCH, tuple(runtime.slots))
    for task_id in runtime.slots:
        call(ops.RELOAD, (task_id,))
    device.log.clear()
    call(ops.END_BACKWARD)


def test_gate_makes_each_sub_group_wait_only_for_its_own_reloads(bound):
    optimizer, runtime, device = gated_runtime(bound)
    offload_all_and_end_backward(runtime, device)
    assert not any(entry[:2] == ("wait_event", "compute") for entry in device.log)  # no wait-for-all
    before = optimizer.snapshot()
    optimizer.step()
    waits = [entry for entry in device.log if entry[:2] == ("wait_event", "compute")]
    reload_events = {task_id: slot.reload_event.name for task_id, slot in runtime.slots.items()}
    assert [event for _, _, event in waits] == [reload_events[t] for t in runtime.slots]
    assert optimizer.prepared == [0, 1]
    assert all(torch.equal(a + 1, b) for a, b in zip(before, optimizer.snapshot()) if a.numel() > 1)


def test_without_gate_end_of_backward_makes_compute_wait_for_every_reload(bound):
    runtime, device = make_runtime(FakeZero3Optimizer())
    bound(runtime)
    offload_all_and_end_backward(runtime, device)
    assert sum(entry[:2] == ("wait_event", "compute") for entry in device.log) == len(runtime.slots)
    assert not any(entry[0] == "synchronize" for entry in device.log)  # a stream wait, not a host wait


def test_end_of_backward_restores_states_with_no_reload_op_and_warns_after_the_compile_step(bound, caplog,
                                                                                         monkeypatch):
    monkeypatch.setattr(logging.getLogger("harness"), "propagate", True)  # to caplog's handler on the root logger
    optimizer = FakeZero3Optimizer()
    runtime, device = make_runtime(optimizer)
    bound(runtime)
    runtime.evict_all()                 # capacity-first: everything out before profiling
    plan_all(runtime, ["1:exp_avg"])     # the plan keeps the rest resident
    call(ops.RELOAD, ("1:exp_avg",))
    call(ops.END_BACKWARD)              # compile step: restores the resident states quietly
    assert runtime.fallback_reloads == len(runtime.slots) - 1
    assert not any(slot.on_host for slot in runtime.slots.values())
    assert "reloaded outside the graph" not in caplog.text
    call(ops.LAUNCH, tuple(runtime.slots))
    call(ops.END_BACKWARD)              # steady state: the reload op did not run
    assert not runtime.slots["1:exp_avg"].on_host
    assert "reloaded outside the graph" in caplog.text


def test_blocking_mode_moves_everything_and_waits_on_the_host(bound):
    optimizer = FakeZero3Optimizer()
    runtime, device = make_runtime(optimizer, mode="blocking")
    bound(runtime)
    plan_all(runtime, [])               # even a plan that offloads nothing
    start = counters()
    call(ops.LAUNCH, tuple(runtime.slots))
    assert all(slot.on_host for slot in runtime.slots.values())
    assert device.log[-1][0] == "synchronize"
    call(ops.RELOAD, ("0:fp32",))        # reload ops do nothing in blocking mode
    assert runtime.slots["0:fp32"].on_host
    call(ops.END_BACKWARD)
    assert not any(slot.on_host for slot in runtime.slots.values())
    assert device.log[-1][0] == "synchronize"
    end = counters()
    assert end["offload_launches"] - start["offload_launches"] == len(runtime.slots)
    assert end["reloads"] - start["reloads"] == len(runtime.slots)


def test_ops_do_nothing_while_deepcompile_profiles(bound):
    profiling = [True]
    runtime, _ = make_runtime(FakeZero3Optimizer(), profiling=lambda: profiling[0])
    bound(runtime)
    plan_all(runtime, list(runtime.slots))
    call(ops.LAUNCH, tuple(runtime.slots))
    assert not any(slot.on_host for slot in runtime.slots.values())
    profiling[0] = False
    call(ops.LAUNCH, tuple(runtime.slots))
    assert all(slot.on_host for slot in runtime.slots.values())


@pytest.mark.parametrize("policy, expected", [
    ("never", [0, 0, 0, 0, 0, 0]),
    ("once_per_phase", [0, 1, 0, 0, 1, 0]),
    ("per_step", [1, 1, 1, 1, 1, 1]),
])
def test_empty_cache_calls_per_step(bound, policy, expected):
    """Six steps: phase 1 plans at its compile step (step 0 here), phase 2 re-plans at step 3."""
    optimizer = FakeZero3Optimizer()
    runtime, device = make_runtime(optimizer, empty_cache=policy)
    bound(runtime)
    per_step = []
    for step in range(6):
        calls_before, counter_before = device.empty_cache_calls, counters()["empty_cache_calls"]
        if step in (0, 3):
            runtime.begin_phase()           # the compile step's forward runs before its plan exists
        call(ops.EMPTY_CACHE)
        call(ops.LAUNCH, tuple(runtime.slots))
        if step in (0, 3):
            runtime.finalize_plan(["1:fp32"])  # made while compiling this step's backward
        call(ops.RELOAD, ("1:fp32",))
        call(ops.END_BACKWARD)
        optimizer.step()
        per_step.append(device.empty_cache_calls - calls_before)
        assert counters()["empty_cache_calls"] - counter_before == per_step[-1]
    assert per_step == expected


# ---------------------------------------------------------------- gradient accumulation

SUB_GROUP_1 = ("1:fp32", "1:exp_avg", "1:exp_avg_sq")


def accumulating(bound, accumulation, **knobs):
    """A gated, bound runtime that reads the micro-batch's place from an engine's accumulation bookkeeping, with
    every copy announced in the device log (a 1 us spin on its stream first)."""
    engine = FakeAccumulatingEngine(accumulation)
    optimizer, runtime, device = gated_runtime(bound, micro_batches=EngineMicroBatches(engine), copy_delay_us=1,
                                               **knobs)
    return optimizer, runtime, device, engine


def run_micro_batches(optimizer, runtime, device, engine, count: int, release_sites=()) -> list[dict]:
    """`count` micro-batches as the compiled graphs and the worker run them: empty-cache and launch ops at the
    forward's head, release ops in it, every planned reload and the end-of-backward op in backward, then
    engine.step(), which steps the optimizer on the boundary. Per micro-batch: copies each way, host waits, compute
    waits, and the states on the host during its forward."""
    seen = []
    for _ in range(count):
        device.log.clear()
        call(ops.EMPTY_CACHE)
        call(ops.LAUNCH, tuple(runtime.slots))
        for site in release_sites:
            ops.op(ops.RELEASE)(torch.zeros(1), ops.REGISTRY.add(ops.RELEASE, site=site))
        on_host = sorted(task_id for task_id, slot in runtime.slots.items() if slot.on_host)
        for task_id in sorted(runtime.planned):
            call(ops.RELOAD, (task_id,))
        call(ops.END_BACKWARD)
        if engine.is_gradient_accumulation_boundary():
            optimizer.step()
        engine.step()
        log = device.log
        seen.append({"out": log.count(("sleep_us", runtime.mover.d2h.name, 1)),
                     "in": log.count(("sleep_us", runtime.mover.h2d.name, 1)),
                     "host_waits": log.count(("synchronize", runtime.mover.d2h.name)),
                     "compute_waits": sum(entry[:2] == ("wait_event", "compute") for entry in log),
                     "on_host_in_forward": on_host})
    return seen


def per_step(seen: list[dict], key: str) -> list:
    return [micro_batch[key] for micro_batch in seen]


def counted_over(run) -> dict:
    """The op counters' change over what `run()` does."""
    start = counters()
    run()
    return {key: value - start[key] for key, value in counters().items()}


def test_with_accumulation_the_states_go_out_in_the_first_micro_batch_and_back_in_the_last(bound):
    optimizer, runtime, device, engine = accumulating(bound, accumulation=4)
    plan_all(runtime, list(SUB_GROUP_1))
    before = optimizer.snapshot()
    for _ in range(2):  # two optimizer steps
        seen = []
        counted = counted_over(lambda: seen.extend(run_micro_batches(optimizer, runtime, device, engine, 4)))
        assert per_step(seen, "out") == [3, 0, 0, 0] and per_step(seen, "in") == [0, 0, 0, 3]
        assert per_step(seen, "on_host_in_forward") == [sorted(SUB_GROUP_1)] * 4
        assert {key: counted[key] for key in ("offload_cycles", "offload_launches", "reloads", "offload_bytes",
                                              "reload_bytes")} == {"offload_cycles": 1, "offload_launches": 3,
                                                                   "reloads": 3, "offload_bytes": 48,
                                                                   "reload_bytes": 48}
    assert optimizer.prepared == [0, 1, 0, 1]  # one optimizer step per four micro-batches, states in place
    assert runtime.fallback_reloads == 0
    assert all(torch.equal(a + 1 + 1, b) for a, b in zip(before, optimizer.snapshot()) if a.numel() > 1)


def test_with_accumulation_blocking_mode_waits_on_the_host_once_each_way_per_optimizer_step(bound):
    optimizer, runtime, device, engine = accumulating(bound, accumulation=4, mode="blocking")
    plan_all(runtime, [])  # blocking moves every state whatever the plan
    seen = []
    counted = counted_over(lambda: seen.extend(run_micro_batches(optimizer, runtime, device, engine, 4)))
    assert per_step(seen, "host_waits") == [1, 0, 0, 1]
    assert per_step(seen, "out") == [6, 0, 0, 0] and per_step(seen, "in") == [0, 0, 0, 6]
    assert counted["offload_cycles"] == 1 and counted["offload_launches"] == counted["reloads"] == 6


def test_with_accumulation_ordered_release_frees_in_the_first_micro_batch_only(bound):
    optimizer, runtime, device, engine = accumulating(bound, accumulation=4, hold=True)
    runtime.begin_phase()
    runtime.finalize_plan(list(SUB_GROUP_1), {"0:mm0": ("1:fp32", "1:exp_avg")})  # 1:exp_avg_sq stays held
    seen = run_micro_batches(optimizer, runtime, device, engine, 4, release_sites=["0:mm0"])
    # micro-batch 0: the two releases wait for their copies; 3: the held state's pointing back and the optimizer
    # step's waits for the two reloads; nothing between
    assert per_step(seen, "compute_waits") == [2, 0, 0, 3]
    assert per_step(seen, "in") == [0, 0, 0, 2]  # the held state comes back without a copy
    assert all(slot.held is None and not slot.on_host for slot in runtime.slots.values())


def test_with_accumulation_empty_cache_per_step_empties_once_per_optimizer_step(bound):
    optimizer, runtime, device, engine = accumulating(bound, accumulation=4, empty_cache="per_step")
    plan_all(runtime, list(SUB_GROUP_1))
    run_micro_batches(optimizer, runtime, device, engine, 8)
    assert device.empty_cache_calls == 2


def test_launch_after_update_sends_the_planned_states_out_as_soon_as_their_sub_group_is_updated(bound):
    """offload.launch=after_update: the first step after the plan sends the planned states out at its launch op
    (they are on the device then); from then on each sub-group's go out right after its update, so the launch op
    finds them out and starts nothing; the values survive, and each step counts one offload cycle once steady."""
    optimizer, runtime, device, engine = accumulating(bound, accumulation=1, launch_after_update=True)
    plan_all(runtime, list(SUB_GROUP_1))
    before = optimizer.snapshot()
    seen = []
    counted = counted_over(lambda: seen.extend(run_micro_batches(optimizer, runtime, device, engine, 3)))
    assert per_step(seen, "out") == [6, 3, 3] and per_step(seen, "in") == [3, 3, 3]
    assert per_step(seen, "on_host_in_forward") == [sorted(SUB_GROUP_1)] * 3
    assert sorted(task_id for task_id, slot in runtime.slots.items() if slot.on_host) == sorted(SUB_GROUP_1)
    assert counted["offload_cycles"] == 4 and counted["offload_launches"] == 12 and counted["reloads"] == 9
    assert runtime.fallback_reloads == 0
    assert all(torch.equal(a + 1 + 1 + 1, b) for a, b in zip(before, optimizer.snapshot()) if a.numel() > 1)


def test_launch_after_update_with_accumulation_sends_the_states_out_once_per_optimizer_step(bound):
    optimizer, runtime, device, engine = accumulating(bound, accumulation=4, launch_after_update=True)
    plan_all(runtime, list(SUB_GROUP_1))
    seen = run_micro_batches(optimizer, runtime, device, engine, 8)
    assert per_step(seen, "out") == [3, 0, 0, 3, 0, 0, 0, 3] and per_step(seen, "in") == [0, 0, 0, 3] * 2
    assert per_step(seen, "on_host_in_forward") == [sorted(SUB_GROUP_1)] * 8


def test_launch_after_update_with_ordered_release_holds_the_blocks_until_their_site(bound):
    optimizer, runtime, device, engine = accumulating(bound, accumulation=1, hold=True, launch_after_update=True)
    runtime.begin_phase()
    runtime.finalize_plan(list(SUB_GROUP_1), {"0:mm0": ("1:fp32", "1:exp_avg")})  # 1:exp_avg_sq stays held
    run_micro_batches(optimizer, runtime, device, engine, 2, release_sites=["0:mm0"])
    held = sorted(task_id for task_id, slot in runtime.slots.items() if slot.held is not None)
    assert held == sorted(SUB_GROUP_1)  # out after the update, blocks kept for the next forward's site
    call(ops.LAUNCH, tuple(runtime.slots))
    ops.op(ops.RELEASE)(torch.zeros(1), ops.REGISTRY.add(ops.RELEASE, site="0:mm0"))
    assert [task_id for task_id, slot in runtime.slots.items() if slot.held is not None] == ["1:exp_avg_sq"]


def test_engine_micro_batches_follow_the_engines_accumulation_bookkeeping():
    engine = FakeAccumulatingEngine(3)
    micro_batches = EngineMicroBatches(engine)
    places = []
    for _ in range(6):
        places.append((micro_batches.first(), micro_batches.last()))
        engine.step()
    assert places == [(True, False), (False, False), (False, True)] * 2
    single = EngineMicroBatches(FakeAccumulatingEngine(1))
    assert single.first() and single.last()


# ---------------------------------------------------------------- config


DS_OK = {"zero_optimization": {"stage": 3}, "compile": {"deepcompile": True}, "gradient_accumulation_steps": 1}
OFFLOAD_OK = {"budget_gb": None, "budget_fraction": None, "margin": 0.2, "mode": "async",
              "empty_cache": "once_per_phase", "streams": "split", "reload": "asap", "release": "recorded",
              "evict_from": "planning_step", "auto_rule": "margin", "budget_rule": "deepspeed", "peak_cap_gb": None,
              "compose": "none", "if_infeasible": "run", "launch": "forward"}


def with_change(base: dict, path: str, value):
    changed = copy.deepcopy(base)
    *parents, leaf = path.split(".")
    node = changed
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return changed


def test_check_config_accepts_the_default():
    check_config(DS_OK, OFFLOAD_OK)


@pytest.mark.parametrize("path, value, key", [
    ("zero_optimization.stage", 2, "zero_optimization.stage"),
    ("zero_optimization.offload_optimizer", {"device": "cpu"}, "zero_optimization.offload_optimizer"),
    ("zero_optimization.offload_param", {"device": "nvme"}, "zero_optimization.offload_param"),
    ("compile.deepcompile", False, "compile.deepcompile"),
    ("compile.offload_opt_states", True, "compile.offload_opt_states"),
    ("compile.offload_parameters", True, "compile.offload_parameters"),
    ("compile.offload_activation", True, "compile.offload_activation"),
])
def test_check_config_refuses_combinations_that_cannot_work(path, value, key):
    with pytest.raises(ConfigError) as error:
        check_config(with_change(DS_OK, path, value), OFFLOAD_OK)
    assert error.value.key == key


def test_check_config_accepts_an_inert_offload_section():
    check_config(with_change(DS_OK, "zero_optimization.offload_optimizer", {"device": "none"}), OFFLOAD_OK)


@pytest.mark.parametrize("knobs", [{}, {"mode": "blocking"}, {"release": "ordered", "peak_cap_gb": 12}])
def test_check_config_accepts_gradient_accumulation_with_every_mode_and_release(knobs):
    check_config(with_change(DS_OK, "gradient_accumulation_steps", 4), {**OFFLOAD_OK, **knobs})


@pytest.mark.parametrize("key, value", [("mode", "sync"), ("empty_cache", "always"), ("streams", "dual"),
                                        ("reload", "late"), ("margin", 1.5), ("budget_gb", -1.0),
                                        ("release", "eager"), ("peak_cap_gb", -2), ("peak_cap_gb", "12"),
                                        ("launch", "early")])
def test_check_config_refuses_bad_knobs(key, value):
    with pytest.raises(ConfigError) as error:
        check_config(DS_OK, {**OFFLOAD_OK, key: value})
    assert error.value.key == f"offload.{key}"


@pytest.mark.parametrize("release", ["ordered", "reclaimed"])
def test_check_config_refuses_release_at_sites_in_blocking_mode(release):
    with pytest.raises(ConfigError) as error:
        check_config(DS_OK, {**OFFLOAD_OK, "mode": "blocking", "release": release})
    assert error.value.key == "offload.release" and release in str(error.value)


def test_check_config_refuses_launch_after_update_in_blocking_mode():
    with pytest.raises(ConfigError) as error:
        check_config(DS_OK, {**OFFLOAD_OK, "mode": "blocking", "launch": "after_update"})
    assert error.value.key == "offload.launch" and "mode=async" in str(error.value)


def test_runtime_refuses_launch_after_update_in_blocking_mode():
    with pytest.raises(ValueError, match="mode async"):
        make_runtime(FakeZero3Optimizer(), mode="blocking", launch_after_update=True)


def test_check_config_names_a_missing_knob():
    knobs = dict(OFFLOAD_OK)
    del knobs["streams"]
    with pytest.raises(ConfigError) as error:
        check_config(DS_OK, knobs)
    assert error.value.key == "offload.streams"


# ---------------------------------------------------------------- ZeRO-3 on DeepSpeed's CPU path


def _zero3_losses(steps: int, offload_from_step: int | None,
                  release_sites: dict[str, tuple[str, ...]] | None = None,
                  evict_from_start: bool = False, accumulation: int = 1,
                  launch_after_update: bool = False) -> tuple[list[float], dict]:
    """Train a small model with DeepSpeed ZeRO-3 (CPU, world size 1). With offload_from_step, drive the runtime
    as the compiled graphs would from that step on: evict, then per micro-batch launch -> forward -> backward ->
    reloads -> end of backward -> engine.step() (gated per sub-group where the optimizer steps). The runtime reads
    each micro-batch's place in the accumulation from the engine, as install() sets it up; `accumulation`
    micro-batches make one optimizer step. With release_sites, the mover holds the offloaded blocks
    (release=ordered) and each site's release op runs right after the launch. With evict_from_start, every state
    leaves the device before step 0 (offload.evict_from=start) and the steps before the plan cycle them. With
    launch_after_update, the planned states go out after their sub-group's update (offload.launch=after_update).
    Returns every micro-batch's loss and what the runtime did."""
    import deepspeed

    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": accumulation,
           "zero_optimization": {"stage": 3, "sub_group_size": 300},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "steps_per_print": 10**9}
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    engine, *_ = deepspeed.initialize(config=cfg, model=model, model_parameters=model.parameters())
    device = FakeDevice()
    runtime = OffloadRuntime(StateMover(device, hold=release_sites is not None), "async",
                             EmptyCachePolicy("never", device.empty_cache), micro_batches=EngineMicroBatches(engine),
                             launch_after_update=launch_after_update)
    SubGroupGate(engine.optimizer, runtime.before_sub_group_step, runtime.after_sub_group_step).install()
    runtime.gated = True
    ops.bind_runtime(runtime)
    generator = torch.Generator().manual_seed(1)
    start = counters()
    losses, seen = [], {"on_host_in_forward": [], "tasks": [], "on_host_after_step": []}
    if evict_from_start:
        runtime.evict_from_start(lambda: discover_tasks(engine.optimizer))
    try:
        for step in range(steps):
            for micro_batch in range(accumulation):
                x, y = torch.randn(2, 16, generator=generator), torch.randn(2, 4, generator=generator)
                compiles = step == offload_from_step and micro_batch == 0  # DeepCompile plans in this backward
                offloading = offload_from_step is not None and step >= offload_from_step
                if compiles:
                    runtime.adopt(discover_tasks(engine.optimizer))
                    runtime.evict_all()
                    runtime.begin_phase()
                    offloaded = [task_id for task_id in runtime.slots if not task_id.startswith("0:")]
                    seen["tasks"] = list(runtime.slots)
                    seen["runtime"] = runtime
                if offloading:
                    call(ops.LAUNCH, tuple(runtime.slots))
                    for site in release_sites or {}:
                        ops.op(ops.RELEASE)(torch.zeros(1), ops.REGISTRY.add(ops.RELEASE, site=site))
                    seen["on_host_in_forward"].append(sorted(t for t, s in runtime.slots.items() if s.on_host))
                loss = torch.nn.functional.mse_loss(engine(x), y)
                engine.backward(loss)
                if offloading:
                    if compiles:
                        runtime.finalize_plan(offloaded, release_sites)
                    for task_id in offloaded:
                        call(ops.RELOAD, (task_id,))
                    call(ops.END_BACKWARD)
                engine.step()
                losses.append(loss.item())
            seen["on_host_after_step"].append(sum(slot.on_host for slot in runtime.slots.values()))
    finally:
        ops.bind_runtime(None)
    seen.update({key: counters()[key] - start[key] for key in ("reloads", "offload_cycles")})
    return losses, seen


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="DeepSpeed's CPU path; on a GPU machine the gpu tests cover it")
def test_zero3_round_trip_keeps_the_losses_of_a_run_without_offload(monkeypatch):
    init_deepspeed_on_cpu(monkeypatch)
    baseline, _ = _zero3_losses(5, offload_from_step=None)
    offloaded, seen = _zero3_losses(5, offload_from_step=1)
    assert seen["tasks"] == ["0:fp32", "0:exp_avg", "0:exp_avg_sq", "1:fp32", "1:exp_avg", "1:exp_avg_sq"]
    # step 1 is the compile step (everything evicted); later steps offload only the planned sub-group 1
    assert seen["on_host_in_forward"] == [sorted(seen["tasks"])] + [["1:exp_avg", "1:exp_avg_sq", "1:fp32"]] * 3
    assert offloaded == baseline
    # only the compile step brought states back outside reload ops: sub-group 0, which the plan keeps resident
    assert seen["runtime"].fallback_reloads == 3


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="DeepSpeed's CPU path; on a GPU machine the gpu tests cover it")
def test_zero3_states_evicted_before_step_0_keep_the_losses(monkeypatch):
    """offload.evict_from=start on real ZeRO-3: step 0 (phase 0) updates with every state on the host between
    sub-group updates; the losses equal a run that never moves a state."""
    init_deepspeed_on_cpu(monkeypatch)
    baseline, _ = _zero3_losses(5, offload_from_step=None)
    offloaded, seen = _zero3_losses(5, offload_from_step=1, evict_from_start=True)
    assert offloaded == baseline
    # the moments come to exist at step 0's updates (torch Adam), and went out after them with the masters
    assert seen["on_host_after_step"][0] == 6
    assert seen["on_host_after_step"][1:] == [0] * 4  # after the plan, states stay for the next launch


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="DeepSpeed's CPU path; on a GPU machine the gpu tests cover it")
def test_zero3_ordered_release_and_held_states_keep_the_losses(monkeypatch):
    init_deepspeed_on_cpu(monkeypatch)
    baseline, _ = _zero3_losses(5, offload_from_step=None)
    # two of sub-group 1's states are released in the forward; its exp_avg_sq stays held all step
    offloaded, seen = _zero3_losses(5, offload_from_step=1, release_sites={"0:mid": ("1:fp32", "1:exp_avg")})
    assert offloaded == baseline
    # reload ops copy back sub-group 1's 3 states at the compile step (sub-group 0 comes back outside them),
    # then 2 per step: the held one is pointed back at its block, no copy
    assert seen["reloads"] == 3 + 2 * 3
    assert all(slot.held is None for slot in seen["runtime"].slots.values())


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="DeepSpeed's CPU path; on a GPU machine the gpu tests cover it")
@pytest.mark.parametrize("release_sites, copied_back", [(None, 3), ({"0:mid": ("1:fp32", "1:exp_avg")}, 2)])
def test_zero3_with_accumulation_moves_the_states_once_per_optimizer_step(monkeypatch, release_sites, copied_back):
    """Gradient accumulation 4 on real ZeRO-3, the micro-batch's place read from DeepSpeed's engine: the planned
    states go out in the first micro-batch and come back in the last, once per optimizer step, and the losses are
    those of the same accumulation without offload."""
    init_deepspeed_on_cpu(monkeypatch)
    baseline, _ = _zero3_losses(4, offload_from_step=None, accumulation=4)
    offloaded, seen = _zero3_losses(4, offload_from_step=1, release_sites=release_sites, accumulation=4)
    assert offloaded == baseline and len(offloaded) == 16
    sub_group_1 = ["1:exp_avg", "1:exp_avg_sq", "1:fp32"]
    # the compile step's eviction holds until its last micro-batch; then sub-group 1 is out in every micro-batch
    assert seen["on_host_in_forward"] == [sorted(seen["tasks"])] * 4 + [sub_group_1] * 8
    assert seen["on_host_after_step"] == [0, 0, 0, 0]
    # sub-group 1 comes back by its reload ops at each step's last micro-batch (a held state without a copy);
    # only the compile step's resident sub-group 0 comes back outside them
    assert seen["reloads"] == 3 + 2 * copied_back and seen["offload_cycles"] == 2
    assert seen["runtime"].fallback_reloads == 3


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="DeepSpeed's CPU path; on a GPU machine the gpu tests cover it")
def test_zero3_states_sent_out_after_their_update_keep_the_losses(monkeypatch):
    """offload.launch=after_update on real ZeRO-3: after the plan, sub-group 1's states leave right after its
    update, and ZeRO-3's own per-sub-group work after the update reads nothing of them it should not; the losses
    equal a run that never moves a state."""
    init_deepspeed_on_cpu(monkeypatch)
    baseline, _ = _zero3_losses(5, offload_from_step=None)
    offloaded, seen = _zero3_losses(5, offload_from_step=1, launch_after_update=True)
    assert offloaded == baseline
    assert seen["on_host_after_step"] == [0, 3, 3, 3, 3]  # out between steps once the plan is armed
    assert seen["on_host_in_forward"] == [sorted(seen["tasks"])] + [["1:exp_avg", "1:exp_avg_sq", "1:fp32"]] * 3
    assert seen["runtime"].fallback_reloads == 3  # the compile step's resident sub-group 0, as without it


# ---------------------------------------------------------------- install (wiring only; CUDA calls stubbed)


def test_install_registers_passes_binds_the_runtime_and_gates_the_optimizer(monkeypatch, tmp_path):
    from types import SimpleNamespace

    import harness.offload as seam
    from harness.offload import schedule

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=8 * 10**10))
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: object())
    registered = {}
    module = torch.nn.Linear(4, 4).to(torch.bfloat16)
    module.bias = torch.nn.Parameter(torch.zeros(4), requires_grad=False)  # fp32, frozen: no gradient to reduce
    engine = SimpleNamespace(optimizer=FakeZero3Optimizer(), global_steps=1, module=module,
                             zero_reduce_bucket_size=lambda: 1000, dp_world_size=2, micro_steps=4,
                             gradient_accumulation_steps=lambda: 4, is_gradient_accumulation_boundary=lambda: False,
                             _config=SimpleNamespace(compile_config=SimpleNamespace(double_buffer=True)),
                             register_compile_pass=lambda name, fn, contract: registered.update({name: (fn, contract)}))
    with pytest.raises(ConfigError):
        seam.install(engine, OFFLOAD_OK, None, str(tmp_path))
    try:
        compile_schedule = seam.install(engine, {**OFFLOAD_OK, "streams": "single"}, 12 * 10**9, str(tmp_path))
        assert compile_schedule == schedule.build_schedule()
        assert registered[schedule.EVICT_PASS][1] is schedule.EVICT_CONTRACT
        assert registered[schedule.PLAN_PASS][1] is schedule.PLAN_CONTRACT
        runtime = ops._runtime
        assert runtime.gated and runtime.mover.d2h is runtime.mover.h2d
        engine.optimizer._prepare_sub_group(0, set())  # the gate runs, then ZeRO-3's own preparation
        assert engine.optimizer.prepared == [0]
        assert seam.plan_facts() == {}  # no plan yet
        assert seam._installed.reduce_buckets == (1000 * 2 * 2, 1000 * 2)  # bf16 gradients, double-buffered
        # gradient accumulation 4: a receive buffer of one bucket's share per rank; the ops ask the engine where
        # the micro-batch sits (micro-step 4 of 4 per optimizer step: a first one, not the boundary)
        assert seam._installed.accumulation_recv_bytes == 1000 * 2 // 2
        assert runtime.micro_batches.first() and not runtime.micro_batches.last()
    finally:
        ops.bind_runtime(None)
