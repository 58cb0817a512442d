"""One budget with DeepCompile's prefetch and selective gather (`offload.compose`): the planner counts what they hold
(profile.json `prefetch_bytes`, `gathered_bytes`; profile.hold), so the plan fits the budget less those bytes and
its predicted peak counts them; with nothing held the plan is the one without composition."""
from __future__ import annotations

import copy

import pytest
from hypothesis import given

from harness.contract.errors import ConfigError
from harness.offload.plan import Plan, make_plan, plan_for_device, plan_offload, plan_within_budget
from harness.offload.profile import parse_profile
from test_plan import PROPERTY_SETTINGS, budgets, profiles
from test_plan_step_model import measured_profile

# what places the states; the budget, the peak and what the plan reports about the profile follow from them
PLACEMENT = ("offloaded", "offloaded_bytes", "resident_bytes", "reloads", "releases", "held")


def holding(profile: dict, prefetch: int = 0, gathered: int = 0) -> dict:
    held = copy.deepcopy(profile)
    held["prefetch_bytes"], held["gathered_bytes"] = prefetch, gathered
    return held


def placement(plan: Plan) -> dict:
    return {key: getattr(plan, key) for key in PLACEMENT}


@PROPERTY_SETTINGS
@given(profiles(), budgets)
def test_nothing_held_leaves_every_rule_s_plan_unchanged(profile, budget):
    for plan in (lambda p: make_plan(p, budget), lambda p: make_plan(p, budget, "at_end", "ordered"),
                 lambda p: plan_for_device(p, budget), lambda p: plan_within_budget(p, budget, budget + 7)):
        assert plan(holding(profile)) == plan(profile)


@PROPERTY_SETTINGS
@given(profiles(), budgets, budgets, budgets)
def test_deepspeeds_sizing_fits_the_budget_less_what_the_passes_hold(profile, budget, prefetch, gathered):
    held = prefetch + gathered
    if held > budget:
        return
    for reload, release in (("asap", "recorded"), ("at_end", "ordered")):
        composed = make_plan(holding(profile, prefetch, gathered), budget, reload, release)
        alone = make_plan(profile, budget - held, reload, release)
        assert placement(composed) == placement(alone)
        assert composed.predicted_peak_bytes == alone.predicted_peak_bytes + held  # no measured start here
        assert composed.budget_bytes == budget
        assert composed.feasible == (alone.predicted_peak_bytes <= budget - held)


@PROPERTY_SETTINGS
@given(profiles(), budgets, budgets)
def test_the_device_rule_and_the_step_model_fit_the_limit_less_what_the_passes_hold(profile, limit, gathered):
    if gathered > limit:
        return
    composed, alone = plan_for_device(holding(profile, gathered=gathered), limit), plan_for_device(profile, limit - gathered)
    assert placement(composed) == placement(alone)
    assert composed.predicted_peak_bytes == alone.predicted_peak_bytes + gathered
    by_model = plan_within_budget(holding(profile, gathered=gathered), limit, limit + 10)
    assert placement(by_model) == placement(plan_within_budget(profile, limit - gathered, limit + 10 - gathered))


def test_holding_memory_offloads_more_at_one_budget():
    profile = measured_profile(measured_start=100)
    alone = plan_offload(profile, 460, None, "step_model")
    composed = plan_offload(holding(profile, prefetch=30, gathered=20), 460, None, "step_model")
    assert alone.feasible and composed.feasible
    assert composed.offloaded_bytes > alone.offloaded_bytes
    assert composed.predicted_peak_bytes <= 460
    assert (composed.prefetch_bytes, composed.gathered_bytes) == (30, 20)
    assert "prefetch_bytes" not in alone.to_dict()  # plans without composition keep their keys


def test_prefetched_parameters_count_in_forward_and_backward_gathered_ones_also_at_the_step_end():
    """Prefetch frees what it gathered after its use; selective gather keeps its parameters through the optimizer
    step. Every state resident (100 bytes), the step end is the peak: 100 at the start + 100 + 400 transient = 600,
    above backward's 400 + 100."""
    profile = measured_profile(measured_start=100, transient=400)
    parsed, prefetched, gathered = (parse_profile(p) for p in
                                    (profile, holding(profile, prefetch=50), holding(profile, gathered=50)))
    assert [n.peak_bytes + 50 for n in parsed.nodes] == [n.peak_bytes for n in prefetched.nodes] \
        == [n.peak_bytes for n in gathered.nodes]
    assert prefetched.step_end_baseline_bytes == parsed.step_end_baseline_bytes == 100
    assert gathered.step_end_baseline_bytes == 150
    keep_all = 10**6
    assert make_plan(profile, keep_all).predicted_peak_bytes == 600
    assert make_plan(holding(profile, prefetch=50), keep_all).predicted_peak_bytes == 600  # backward 550 < 600
    assert make_plan(holding(profile, gathered=50), keep_all).predicted_peak_bytes == 650
    assert make_plan(holding(profile, prefetch=150), keep_all).predicted_peak_bytes == 650  # backward 550 + 100


@pytest.mark.parametrize("key", ["prefetch_bytes", "gathered_bytes"])
def test_a_bad_held_amount_names_its_key(key):
    profile = measured_profile()
    profile[key] = -1
    with pytest.raises(ConfigError, match=f"profile.{key}"):
        parse_profile(profile)
