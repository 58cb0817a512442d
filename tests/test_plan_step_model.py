"""The planner's step model calibrated to the running step (profile.py), the auto rule at a device limit
(plan.plan_for_device, `harness plan --device-gb`) and a budget planned by it (plan.plan_within_budget)."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.offload.plan import Plan, device_limit_bytes, make_plan, plan_for_device, plan_within_budget
from harness.offload.profile import parse_profile
from test_plan import profiles

REPO_ROOT = Path(__file__).resolve().parent.parent
SETTINGS = settings(max_examples=150, deadline=None)


def measured_profile(outside=0, measured_start=None, transient=0, freed=(0, 0, 0)) -> dict:
    """One forward and one backward graph; readings carry `outside` bytes the allocator does not hold."""
    profile = {
        "graph_order": [[0, False], [0, True]],
        "graphs": [
            {"graph_id": 0, "bwd": False, "start_alloc_bytes": 100 + outside,
             "nodes": [{"name": "f0", "peak_bytes": 150 + outside}, {"name": "f1", "peak_bytes": 300 + outside}]},
            {"graph_id": 0, "bwd": True,
             "nodes": [{"name": f"b{i}", "peak_bytes": peak + outside, "inputs_freed_bytes": gone}
                       for i, (peak, gone) in enumerate(zip((400, 380, 360), freed))]},
        ],
        "tasks": [{"id": "0:fp32", "bytes": 40}, {"id": "0:exp_avg", "bytes": 40}, {"id": "1:fp32", "bytes": 20}],
        "step_transient_bytes": transient,
    }
    if measured_start is not None:
        profile["measured_start_bytes"] = measured_start
    return profile


def test_readings_outside_the_allocator_come_off_every_node():
    parsed = parse_profile(measured_profile(outside=70, measured_start=100))
    assert parsed.outside_bytes == 70
    assert [node.peak_bytes for node in parsed.nodes] == [150, 300, 400, 380, 360]


def test_without_a_measured_start_the_profile_is_taken_as_read():
    parsed = parse_profile(measured_profile(outside=70))
    assert parsed.outside_bytes == 0
    assert [node.peak_bytes for node in parsed.nodes] == [220, 370, 470, 450, 430]


def test_backward_inputs_freed_before_a_node_come_off_it():
    parsed = parse_profile(measured_profile(measured_start=100, freed=(0, 50, 200)))
    assert [node.peak_bytes for node in parsed.nodes if node.bwd] == [400, 330, 160]


def test_reduce_buckets_are_added_to_every_backward_node_only():
    profile = {**measured_profile(measured_start=100), "reduce_bucket_bytes": 25}
    assert [node.peak_bytes for node in parse_profile(profile).nodes] == [150, 300, 425, 405, 385]


def test_a_measured_steady_step_caps_forward_nodes_and_counts_backward_at_the_measured_peak():
    profile = {**measured_profile(measured_start=100), "reduce_bucket_bytes": 25, "measured_fwd_bwd_peak_bytes": 345}
    # forward below the measured peak stays as read; backward's peak is measured, not placed
    assert [node.peak_bytes for node in parse_profile(profile).nodes] == [150, 300, 345, 345, 345]
    low = {**profile, "measured_fwd_bwd_peak_bytes": 200}  # an eager forward reading above the step's peak
    assert [node.peak_bytes for node in parse_profile(low).nodes] == [150, 200, 200, 200, 200]
    as_read = parse_profile(profile, calibrated=False)  # a budget's plan is placed on the readings as profiled
    assert [node.peak_bytes for node in as_read.nodes] == [150, 300, 400, 380, 360]
    # the prediction follows: nothing offloaded at a budget above every node, and the end of step is lower here
    assert make_plan(profile, 10_000).predicted_peak_bytes == 345 + 100


def test_accumulations_receive_buffer_is_added_to_every_backward_node_only():
    profile = {**measured_profile(measured_start=100), "reduce_bucket_bytes": 25, "accumulation_recv_bytes": 10}
    assert [node.peak_bytes for node in parse_profile(profile).nodes] == [150, 300, 435, 415, 395]
    # a measured step with accumulation holds the buffer already: backward counts at it, forward as read
    measured = {**profile, "measured_fwd_bwd_peak_bytes": 345}
    assert [node.peak_bytes for node in parse_profile(measured).nodes] == [150, 300, 345, 345, 345]


def test_with_accumulation_the_optimizer_step_holds_what_it_holds_without():
    # the gradients accumulate in ZeRO-3's partitions, which the measured start holds at any accumulation
    alone = measured_profile(measured_start=400, transient=40, freed=(0, 300, 300))
    accumulating = {**alone, "accumulation_recv_bytes": 10}
    assert make_plan(accumulating, 10_000).predicted_peak_bytes == make_plan(alone, 10_000).predicted_peak_bytes \
        == 400 + 100 + 40


def test_device_rule_makes_room_for_accumulations_receive_buffer():
    alone = measured_profile(measured_start=100)
    assert plan_for_device(alone, 460).offloaded == ["0:exp_avg", "1:fp32"]  # backward 400 + the first state
    plan = plan_for_device({**alone, "accumulation_recv_bytes": 30}, 460)  # backward 430: no room for a state
    assert plan.offloaded == ["0:fp32", "0:exp_avg", "1:fp32"] and plan.feasible
    assert plan.predicted_peak_bytes <= 460


def test_optimizer_step_is_the_measured_start_plus_every_state_plus_its_transient():
    # budget above every node: nothing offloaded, so the step's end decides the peak
    plan = make_plan(measured_profile(measured_start=100, transient=40, freed=(0, 300, 300)), 10_000)
    assert plan.offloaded == []
    assert plan.predicted_peak_bytes == max(400 + 100, 100 + 100 + 40)
    plan = make_plan(measured_profile(measured_start=400, transient=40, freed=(0, 300, 300)), 10_000)
    assert plan.predicted_peak_bytes == 400 + 100 + 40


def test_device_rule_keeps_what_fits_and_offloads_the_rest():
    profile = measured_profile(measured_start=100)
    assert plan_for_device(profile, 10_000).offloaded == []
    plan = plan_for_device(profile, 460)  # backward peak 400: room for the first 40-byte state only
    assert plan.offloaded == ["0:exp_avg", "1:fp32"] and plan.feasible and plan.rule == "device_limit"
    assert plan.predicted_peak_bytes <= 460
    hopeless = plan_for_device(profile, 300)  # under the backward node alone: only no resident state reaches 400
    assert hopeless.offloaded_bytes == hopeless.total_state_bytes and not hopeless.feasible
    assert hopeless.predicted_peak_bytes == 400


def test_device_rule_under_the_optimizer_steps_floor_offloads_only_what_lowers_the_peak():
    # the optimizer step (measured start 100 + every state 100 + transient 280 = 480) is the peak whatever is
    # offloaded; backward (400) with the first two states resident reaches it, with all three it passes it
    profile = measured_profile(measured_start=100, transient=280)
    plan = plan_for_device(profile, 350)
    assert not plan.feasible and plan.predicted_peak_bytes == 480
    assert plan.offloaded == ["1:fp32"]


def test_device_rule_reloads_in_backward_only_beside_the_measured_peak():
    profile = measured_profile(measured_start=100)
    limit = 440  # room for the first state beside the backward peak (400 + 40), for no reload on top of it
    # as profiled, backward falls after b0, so the first reload fits after b1
    assert [r.after_node for r in plan_for_device(profile, limit).reloads] == ["b1", "b2"]
    measured = {**profile, "measured_fwd_bwd_peak_bytes": 380}
    plan = plan_for_device(measured, limit)
    assert plan.offloaded == ["0:exp_avg", "1:fp32"]
    assert [r.after_node for r in plan.reloads] == ["b2", "b2"]  # after backward: the peak may be anywhere
    assert plan.predicted_peak_bytes == 380 + 40


def test_device_limit_subtracts_the_measured_overhead():
    assert device_limit_bytes(16_000, 1_500) == 14_500
    assert device_limit_bytes(16_000, None) == 16_000
    assert device_limit_bytes(1_000, 5_000) == 0


@st.composite
def steady_profiles(draw) -> dict:
    """Random profiles, half of them with a measured forward + backward peak (backward then counts at it)."""
    profile = draw(profiles())
    measured = draw(st.one_of(st.none(), st.integers(0, 60)))
    return profile if measured is None else {**profile, "measured_fwd_bwd_peak_bytes": measured}


@SETTINGS
@given(steady_profiles(), st.integers(0, 200), st.sampled_from(["asap", "at_end"]))
def test_device_rule_fits_whenever_any_plan_fits_and_offloads_the_least(profile, limit, reload):
    plan = plan_for_device(profile, limit, reload)
    # every plan a fixed budget can make, placed under the same cap; those predicted to fit the limit
    candidates = [make_plan(profile, budget, reload, cap_bytes=limit) for budget in range(0, 250)]
    fitting = [candidate for candidate in candidates if candidate.predicted_peak_bytes <= limit]
    if fitting:
        assert plan.feasible and plan.predicted_peak_bytes <= limit
        assert plan.offloaded_bytes <= min(candidate.offloaded_bytes for candidate in fitting)
    else:  # the lowest peak any plan reaches, with the least offload that reaches it
        lowest = min(candidate.predicted_peak_bytes for candidate in candidates)
        assert not plan.feasible and plan.predicted_peak_bytes == lowest
        assert plan.offloaded_bytes <= min(candidate.offloaded_bytes for candidate in candidates
                                              if candidate.predicted_peak_bytes == lowest)


@SETTINGS
@given(profiles(), st.integers(0, 60), st.integers(0, 200))
def test_with_a_measured_peak_reloads_during_backward_are_counted_at_it(profile, measured, limit):
    plan = plan_for_device({**profile, "measured_fwd_bwd_peak_bytes": measured}, limit)
    graph_id, _ = profile["graph_order"][-1]
    last = next(graph for graph in profile["graphs"] if graph["bwd"] and graph["graph_id"] == graph_id)["nodes"][-1]
    sizes = {task["id"]: task["bytes"] for task in profile["tasks"]}
    early = sum(sizes[reload.task] for reload in plan.reloads
                if (reload.graph_id, reload.after_node) != (graph_id, last["name"]))
    assert plan.predicted_peak_bytes >= measured + plan.resident_bytes + early
    if plan.feasible:
        assert measured + plan.resident_bytes + early <= limit


@SETTINGS
@given(steady_profiles(), st.integers(0, 200), st.integers(0, 200), st.sampled_from(["asap", "at_end"]))
def test_more_device_never_moves_more(profile, limit_a, limit_b, reload):
    small, large = sorted((limit_a, limit_b))
    assert plan_for_device(profile, large, reload).offloaded_bytes <= \
        plan_for_device(profile, small, reload).offloaded_bytes


@pytest.mark.slow
def test_cli_device_gb_plans_at_the_device_less_the_profiled_overhead(tmp_path):
    profile = measured_profile(measured_start=100)
    profile["allocator_overhead_bytes"] = 40
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    result = subprocess.run([sys.executable, "-m", "harness.cli", "plan", "--profile", str(path),
                             "--device-gb", str(500 / 1e9)], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    plan = Plan.from_json(result.stdout)
    assert plan.budget_bytes == 460 and plan.offloaded == ["0:exp_avg", "1:fp32"]


def run_cli(tmp_path, profile: dict, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    return subprocess.run([sys.executable, "-m", "harness.cli", "plan", "--profile", str(path), *args],
                          cwd=REPO_ROOT, capture_output=True, text=True)


@pytest.mark.slow
def test_cli_refuses_a_device_size_with_a_budget_planned_as_deepspeed(tmp_path):
    result = run_cli(tmp_path, measured_profile(), "--device-gb", "1", "--budget-gb", "1", "--budget-rule", "deepspeed")
    assert result.returncode == 2 and "device_gb" in result.stderr and result.stderr.count("\n") == 1


@pytest.mark.slow
def test_cli_needs_a_budget_or_a_device_size(tmp_path):
    result = run_cli(tmp_path, measured_profile())
    assert result.returncode == 2 and "--device-gb" in result.stderr and result.stderr.count("\n") == 1


@pytest.mark.slow
def test_cli_budget_rule_step_model_fits_the_lesser_of_budget_and_device(tmp_path):
    profile = {**measured_profile(measured_start=100), "allocator_overhead_bytes": 40}
    gb = lambda n: str(n / 1e9)  # noqa: E731
    by_device = json.loads(run_cli(tmp_path, profile, "--budget-gb", gb(1000), "--budget-rule", "step_model",
                                   "--device-gb", gb(500)).stdout)
    assert by_device["budget_bytes"] == 460 and by_device["rule"] == "step_model"
    by_budget = json.loads(run_cli(tmp_path, profile, "--budget-gb", gb(430), "--budget-rule", "step_model",
                                   "--device-gb", gb(500)).stdout)
    assert by_budget["budget_bytes"] == 430 and by_budget["offloaded_bytes"] > by_device["offloaded_bytes"]
    refused = run_cli(tmp_path, profile, "--budget-gb", "1", "--budget-rule", "cheapest")
    assert refused.returncode == 2 and "offload.budget_rule" in refused.stderr


def test_a_budget_by_the_step_model_keeps_what_deepspeeds_sizing_offloads():
    # the profile reads 200 bytes the allocator never holds: DeepSpeed's sizing sees a forward peak of 500 and no
    # room for any state in 500; the step model sees backward peak at 400 and room for all 100 bytes of states
    profile = measured_profile(outside=200, measured_start=100)
    deepspeed, by_model = make_plan(profile, 500), plan_within_budget(profile, 500, 10_000)
    assert deepspeed.offloaded_bytes == 100 and by_model.offloaded_bytes == 0
    assert by_model.predicted_peak_bytes <= 500 and by_model.budget_bytes == 500


@SETTINGS
@given(steady_profiles(), st.integers(0, 200), st.integers(0, 200), st.sampled_from(["asap", "at_end"]))
def test_a_budget_by_the_step_model_is_the_device_rule_under_the_lesser_limit(profile, budget, limit, reload):
    plan = plan_within_budget(profile, budget, limit, reload)
    device_rule = plan_for_device(profile, min(budget, limit), reload)
    assert dataclasses.replace(plan, rule=None) == dataclasses.replace(device_rule, rule=None)
    assert plan.rule == "step_model"
    if plan.feasible:
        assert plan.predicted_peak_bytes <= min(budget, limit)


def test_ordered_release_frees_the_states_before_a_forward_node_that_reads_high_below_the_measured_peak():
    # Backward reads 425 with its buckets, the running step peaks at 320: forward f1 still holds 300, as read. Keeping
    # 40 resident and 60 held, f1 needs 400 of a 390 limit, so the states must be freed before it (a uniform shift
    # down by 105 would have put f1 at 195 and planned no release at all).
    profile = {**measured_profile(measured_start=100), "reduce_bucket_bytes": 25, "measured_fwd_bwd_peak_bytes": 320}
    plan = plan_for_device(profile, 390, release="ordered")
    assert plan.resident_bytes == 40 and plan.offloaded_bytes == 60
    assert {release.before_node for release in plan.releases} == {"f1"}
    assert plan.feasible and plan.predicted_peak_bytes <= 390
