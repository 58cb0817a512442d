"""The offload planner: exact plans for hand-made profiles, properties over random ones, validation, the CLI."""
from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.contract.errors import ConfigError
from harness.offload.plan import Plan, Release, make_plan, plan_file_text, plan_offload, read_plan_file
from harness.offload.profile import load_profile

REPO_ROOT = Path(__file__).resolve().parents[1]
SMALL_PROFILE_PATH = REPO_ROOT / "tests" / "data" / "profile_small.json"

# profile_small.json, in execution order (graph 1 is the second forward graph, so its backward runs first):
#   fwd 0: embed 10, mm0 30 | fwd 1: mm1 40, loss 45 | bwd 1: loss_bwd 52, mm1_bwd 50 | bwd 0: mm0_bwd 35, embed_bwd 16
#   forward peak = 45 (sizes the resident set), floor = 52 (loss_bwd), last backward peak = 16
#   tasks: 0:exp_avg 8, 0:exp_avg_sq 8, 0:hp_param 8, 1:exp_avg 4, 1:exp_avg_sq 4, 1:hp_param 4 -> total 36
TASK_IDS = ["0:exp_avg", "0:exp_avg_sq", "0:hp_param", "1:exp_avg", "1:exp_avg_sq", "1:hp_param"]


@pytest.fixture
def small_profile() -> dict:
    return json.loads(SMALL_PROFILE_PATH.read_text())


def reload_points(plan: dict) -> list[tuple[str, int, str]]:
    return [(reload.task, reload.graph_id, reload.after_node) for reload in plan.reloads]


def two_graph_profile(forward_peaks: list[int], backward_peaks: list[int], task_bytes: dict[str, int]) -> dict:
    """One forward and one backward graph; forward nodes f0.., backward nodes b0.."""
    def nodes(prefix: str, peaks: list[int]) -> list[dict]:
        return [{"name": f"{prefix}{index}", "peak_bytes": peak} for index, peak in enumerate(peaks)]
    return {"graph_order": [[0, False], [0, True]],
            "graphs": [{"graph_id": 0, "bwd": False, "nodes": nodes("f", forward_peaks)},
                       {"graph_id": 0, "bwd": True, "nodes": nodes("b", backward_peaks)}],
            "tasks": [{"id": task_id, "bytes": size} for task_id, size in task_bytes.items()]}


# ---------------------------------------------------------------- exact plans


def test_budget_above_floor_plus_states_offloads_nothing(small_profile):
    plan = make_plan(small_profile, 100)
    # 45 + 36 = 81 <= 100: everything stays; the peak is loss_bwd with all states on top, 52 + 36 = 88.
    assert plan.offloaded == [] and plan.reloads == []
    assert (plan.resident_bytes, plan.offloaded_bytes, plan.total_state_bytes) == (36, 0, 36)
    assert (plan.forward_peak_bytes, plan.floor_bytes) == (45, 52)
    assert (plan.predicted_peak_bytes, plan.feasible) == (88, True)


def test_partial_budget_keeps_a_prefix_and_reloads_as_early_as_fits(small_profile):
    plan = make_plan(small_profile, 68, "asap")
    # Headroom 68 - 45 = 23 keeps 8 + 8; the next 8 does not fit in the 7 left, and the planner stops there
    # even though 1:exp_avg (4) would fit after it.
    assert plan.offloaded == TASK_IDS[2:]
    assert (plan.resident_bytes, plan.offloaded_bytes) == (16, 20)
    # After loss_bwd the later peak is 50: 50+16+8 = 74 > 68, nothing. After mm1_bwd the later peak is 35:
    # 35+16+8 = 59, 35+24+4 = 63, 35+28+4 = 67 fit, 35+32+4 = 71 does not. After mm0_bwd (later 16): 16+32+4 = 52.
    assert reload_points(plan) == [("0:hp_param", 1, "mm1_bwd"), ("1:exp_avg", 1, "mm1_bwd"),
                                   ("1:exp_avg_sq", 1, "mm1_bwd"), ("1:hp_param", 0, "mm0_bwd")]
    assert all(reload.bwd is True for reload in plan.reloads)
    # Node costs: forward up to 45+16 = 61, loss_bwd 52+16 = 68, mm1_bwd 50+16 = 66, mm0_bwd 35+32 = 67,
    # embed_bwd 16+36 = 52, end 16+36 = 52.
    assert (plan.predicted_peak_bytes, plan.feasible, plan.reload_policy) == (68, True, "asap")


def test_at_end_reloads_everything_after_the_last_backward_node(small_profile):
    plan = make_plan(small_profile, 68, "at_end")
    assert plan.offloaded == TASK_IDS[2:]
    assert reload_points(plan) == [(task, 0, "embed_bwd") for task in TASK_IDS[2:]]
    # max(floor + resident, last peak + total) = max(52+16, 16+36)
    assert (plan.predicted_peak_bytes, plan.feasible, plan.reload_policy) == (68, True, "at_end")


def test_resident_set_is_sized_by_the_forward_peak_not_the_backward_one(small_profile):
    # Headroom 66 - 45 = 21 keeps 8 + 8 (against the floor, 66 - 52 = 14 would keep one 8).
    plan = make_plan(small_profile, 66)
    assert plan.offloaded == TASK_IDS[2:] and plan.resident_bytes == 16
    # After loss_bwd (later 50): 50+16+8 = 74 > 66. After mm1_bwd (later 35): 59 and 63 fit, 67 does not.
    # After mm0_bwd (later 16): 16+28+4 = 48 and 52 fit.
    assert reload_points(plan) == [("0:hp_param", 1, "mm1_bwd"), ("1:exp_avg", 1, "mm1_bwd"),
                                   ("1:exp_avg_sq", 0, "mm0_bwd"), ("1:hp_param", 0, "mm0_bwd")]
    # loss_bwd holds 52 + 16 = 68 > 66 whatever the reloads do; every other node fits (mm1_bwd 50+16 = 66,
    # mm0_bwd 35+28 = 63, embed_bwd 16+36 = 52).
    assert (plan.predicted_peak_bytes, plan.feasible) == (68, False)
    _, per_node = simulate(small_profile, plan)
    assert [cost > 66 for cost in per_node] == [False] * 4 + [True] + [False] * 3
    # Forward peak + all states = 81: nothing is offloaded, though backward then needs 52 + 36 = 88.
    keep_all = make_plan(small_profile, 81)
    assert keep_all.offloaded == [] and (keep_all.predicted_peak_bytes, keep_all.feasible) == (88, False)


def test_reloads_wait_until_the_nodes_that_overflow_anyway_have_run():
    profile = two_graph_profile([4], [10, 9, 1], {"a": 3, "b": 3})
    plan = make_plan(profile, 8)
    # Headroom 8 - 4 = 4 keeps a (the floor, 10, would keep nothing). b0 and b1 overflow with a alone (13, 12):
    # after b0 (later 9) 9+3+3 = 15 > 8; after b1 (later 1) 1+3+3 = 7 fits.
    assert plan.offloaded == ["b"]
    assert reload_points(plan) == [("b", 0, "b1")]
    assert (plan.predicted_peak_bytes, plan.feasible) == (13, False)
    # With b1 the last node, no node before the end has room: the reload goes after the last node.
    profile = two_graph_profile([4], [10, 9], {"a": 3, "b": 3})
    plan = make_plan(profile, 8)
    assert plan.offloaded == ["b"] and reload_points(plan) == [("b", 0, "b1")]
    assert (plan.predicted_peak_bytes, plan.feasible) == (15, False)  # end: 9 + 6


def test_more_budget_can_lose_feasibility():
    profile = two_graph_profile([2], [8, 0], {"a": 1, "b": 8})
    # Budget 9: headroom 7 keeps a; b comes back after b0 (later 0): 0+1+8 = 9. Costs: b0 8+1, b1 9, end 9.
    fits = make_plan(profile, 9)
    assert fits.offloaded == ["b"] and (fits.predicted_peak_bytes, fits.feasible) == (9, True)
    # Budget 11: headroom 9 keeps both, and b0 then holds 8 + 9 = 17.
    overflows = make_plan(profile, 11)
    assert overflows.offloaded == [] and (overflows.predicted_peak_bytes, overflows.feasible) == (17, False)


def test_budget_equal_to_floor_offloads_all_and_fits_exactly(small_profile):
    plan = make_plan(small_profile, 52)
    # Headroom 52 - 45 = 7 keeps nothing.
    assert plan.offloaded == TASK_IDS and plan.resident_bytes == 0
    # loss_bwd (later 50): 50+8 = 58 does not fit. mm1_bwd (later 35): 35+8 = 43, 35+16 = 51 fit, 59 not.
    # mm0_bwd (later 16): 16+24, 16+28, 16+32, 16+36 fit.
    assert reload_points(plan) == [("0:exp_avg", 1, "mm1_bwd"), ("0:exp_avg_sq", 1, "mm1_bwd"),
                                   ("0:hp_param", 0, "mm0_bwd"), ("1:exp_avg", 0, "mm0_bwd"),
                                   ("1:exp_avg_sq", 0, "mm0_bwd"), ("1:hp_param", 0, "mm0_bwd")]
    # loss_bwd 52, mm1_bwd 50, mm0_bwd 35+16, embed_bwd 16+36, end 16+36
    assert (plan.predicted_peak_bytes, plan.feasible) == (52, True)


def test_budget_below_floor_is_infeasible_and_still_offloads_all(small_profile):
    plan = make_plan(small_profile, 50)
    assert plan.offloaded == TASK_IDS
    # mm1_bwd (later 35): 35+8 = 43 fits, 51 not. mm0_bwd (later 16): 32, 40, 44, 48 fit, 52 not. The rest go last.
    assert reload_points(plan) == [("0:exp_avg", 1, "mm1_bwd"), ("0:exp_avg_sq", 0, "mm0_bwd"),
                                   ("0:hp_param", 0, "mm0_bwd"), ("1:exp_avg", 0, "mm0_bwd"),
                                   ("1:exp_avg_sq", 0, "mm0_bwd"), ("1:hp_param", 0, "embed_bwd")]
    assert (plan.predicted_peak_bytes, plan.feasible) == (52, False)  # loss_bwd alone, and the end


def test_states_that_cannot_all_return_make_the_plan_infeasible():
    profile = two_graph_profile([10], [10, 8], {"a": 6, "b": 6})
    plan = make_plan(profile, 14)
    # Headroom 14 - 10 = 4 keeps nothing. After b0 (later 8): 8+6 = 14 fits exactly, 8+12 = 20 does not; b goes last.
    assert plan.offloaded == ["a", "b"]
    assert reload_points(plan) == [("a", 0, "b0"), ("b", 0, "b1")]
    # Every node fits (b1: 8+6 = 14), but the step's end needs 8 + 12 = 20 > 14.
    assert (plan.predicted_peak_bytes, plan.feasible) == (20, False)


def test_make_plan_leaves_its_input_alone(small_profile):
    before = copy.deepcopy(small_profile)
    make_plan(small_profile, 60)
    assert small_profile == before


def test_plan_json_is_stable(small_profile):
    plan = make_plan(small_profile, 68, release="ordered", cap_bytes=60)
    text = plan.to_json()
    assert Plan.from_json(text) == plan and Plan.from_json(text).to_json() == text
    assert list(json.loads(text)) == sorted(json.loads(text))


def test_every_committed_plan_json_reads_back_as_plans():
    """plan.json of the committed runs (one phase or keyed by phase, older ones without `rule`) stays readable, and
    a file as the pass writes it today is written again the same."""
    files = sorted(REPO_ROOT.glob("results/*/sweep/*/plan.json"))
    assert files
    for path in files:
        records = read_plan_file(path.read_text())
        assert records and all(isinstance(record.plan, Plan) for record in records.values())
        assert all(record.plan.offloaded_bytes >= 0 for record in records.values())
        if '"rule"' in path.read_text():
            assert json.loads(plan_file_text(records)) == json.loads(path.read_text()), path


# ---------------------------------------------------------------- validation


def _set(path: list, value):
    def mutate(profile: dict) -> None:
        target = profile
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value
    return mutate


def _empty_backward_graphs(profile: dict) -> None:
    for graph in profile["graphs"]:
        if graph["bwd"]:
            graph["nodes"] = []


BAD_PROFILES = [
    (_set(["tasks", 3, "bytes"], -1), "profile.tasks[3].bytes"),
    (_set(["tasks", 0, "bytes"], 1.5), "profile.tasks[0].bytes"),
    (_set(["tasks", 0, "bytes"], True), "profile.tasks[0].bytes"),
    (_set(["tasks", 4, "id"], "0:exp_avg"), "profile.tasks[4].id"),
    (_set(["tasks", 1], "0:exp_avg_sq"), "profile.tasks[1]"),
    (_set(["graphs", 2, "nodes", 1, "peak_bytes"], -5), "profile.graphs[2].nodes[1].peak_bytes"),
    (_set(["graphs", 2, "nodes", 1, "name"], "loss_bwd"), "profile.graphs[2].nodes[1].name"),
    (_set(["graphs", 0, "bwd"], "no"), "profile.graphs[0].bwd"),
    (_set(["graphs", 3, "graph_id"], 1), "profile.graphs[3]"),
    (_set(["graph_order", 0], [7, False]), "profile.graph_order[0]"),
    (_set(["graph_order", 1], [0, False]), "profile.graph_order[1]"),
    (_set(["graph_order"], [[0, False], [1, True], [1, False], [0, True]]), "profile.graph_order[2]"),
    (_set(["graph_order"], [[0, False], [1, False], [1, True]]), "profile.graphs[3]"),
    (_set(["graph_order", 0], 0), "profile.graph_order[0]"),
    (_empty_backward_graphs, "profile.graphs"),  # nowhere to reload
    (_set(["device_total_bytes"], -1), "profile.device_total_bytes"),
    (_set(["tasks"], None), "profile.tasks"),
]


@pytest.mark.parametrize("mutate, key", BAD_PROFILES)
def test_bad_profiles_name_the_key(small_profile, mutate, key):
    mutate(small_profile)
    with pytest.raises(ConfigError) as error:
        make_plan(small_profile, 68)
    assert error.value.key == key


@pytest.mark.parametrize("budget, reload, key", [
    (-1, "asap", "offload.budget_bytes"),
    (80.0, "asap", "offload.budget_bytes"),
    (80, "eager", "offload.reload"),
])
def test_bad_arguments_name_the_key(small_profile, budget, reload, key):
    with pytest.raises(ConfigError) as error:
        make_plan(small_profile, budget, reload)
    assert error.value.key == key


def test_load_profile_reads_a_valid_file(small_profile):
    assert load_profile(SMALL_PROFILE_PATH) == small_profile


@pytest.mark.parametrize("content", [None, "{not json", "[1, 2]", '{"graphs": [], "graph_order": [], "tasks": []}'])
def test_load_profile_refuses_missing_or_malformed_files(tmp_path, content):
    path = tmp_path / "profile.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as error:
        load_profile(path)
    assert error.value.key.startswith("profile")
    assert "\n" not in str(error.value)


# ---------------------------------------------------------------- properties


@st.composite
def profiles(draw) -> dict:
    """1-3 forward graphs, backward graphs for the last 1..all of them in reverse order, 0-7 tasks."""
    n_fwd = draw(st.integers(1, 3))
    n_bwd = draw(st.integers(1, n_fwd))
    peaks = st.integers(0, 40)  # small ranges make exact fits (budget == cost) common

    def graph(graph_id: int, bwd: bool, min_nodes: int) -> dict:
        node_peaks = draw(st.lists(peaks, min_size=min_nodes, max_size=4))
        return {"graph_id": graph_id, "bwd": bwd,
                "nodes": [{"name": f"n{index}", "peak_bytes": peak} for index, peak in enumerate(node_peaks)]}

    order = [[graph_id, False] for graph_id in range(n_fwd)]
    order += [[graph_id, True] for graph_id in reversed(range(n_fwd - n_bwd, n_fwd))]
    task_bytes = draw(st.lists(st.integers(1, 15), max_size=7))
    return {"graph_order": order,
            "graphs": [graph(graph_id, bwd, 1 if bwd else 0) for graph_id, bwd in order],
            "tasks": [{"id": f"{index}:state", "bytes": size} for index, size in enumerate(task_bytes)]}


budgets = st.integers(0, 150)
PROPERTY_SETTINGS = settings(max_examples=150, deadline=None)


def execution_order(profile: dict) -> list[tuple[int, bool, dict]]:
    graphs = {(graph["graph_id"], graph["bwd"]): graph for graph in profile["graphs"]}
    return [(graph_id, bwd, node) for graph_id, bwd in profile["graph_order"]
            for node in graphs[(graph_id, bwd)]["nodes"]]


def forward_peak(profile: dict) -> int:
    return max((node["peak_bytes"] for _, bwd, node in execution_order(profile) if not bwd), default=0)


def simulate(profile: dict, plan: dict) -> tuple[int, list[int]]:
    """Replay the plan node by node: (peak incl. the step's end, per-node bytes in use incl. the node's peak)."""
    offloaded = set(plan.offloaded)
    task_bytes = {task["id"]: task["bytes"] for task in profile["tasks"]}
    in_use = sum(size for task_id, size in task_bytes.items() if task_id not in offloaded)
    per_node = []
    for graph_id, bwd, node in execution_order(profile):
        per_node.append(node["peak_bytes"] + in_use)
        in_use += sum(task_bytes[reload.task] for reload in plan.reloads
                      if bwd and (reload.graph_id, reload.after_node) == (graph_id, node["name"]))
    assert in_use == sum(task_bytes.values())  # every state is back for the optimizer step
    last_bwd_peak = [node for _, bwd, node in execution_order(profile) if bwd][-1]["peak_bytes"]
    return max(per_node + [last_bwd_peak + in_use]), per_node


@PROPERTY_SETTINGS
@given(profiles(), budgets, st.sampled_from(["asap", "at_end"]))
def test_plan_is_consistent_with_a_replay(profile, budget, reload):
    plan = make_plan(profile, budget, reload)
    task_ids = [task["id"] for task in profile["tasks"]]
    assert plan.resident_bytes + plan.offloaded_bytes == plan.total_state_bytes
    assert plan.total_state_bytes == sum(task["bytes"] for task in profile["tasks"])
    assert plan.offloaded == task_ids[len(task_ids) - len(plan.offloaded):]  # a suffix, in task order
    # Every offloaded task comes back exactly once, in task order, after a node of a backward graph.
    assert [reload.task for reload in plan.reloads] == plan.offloaded
    bwd_nodes = {(graph_id, node["name"]) for graph_id, bwd, node in execution_order(profile) if bwd}
    assert all((reload.graph_id, reload.after_node) in bwd_nodes for reload in plan.reloads)
    peak, _ = simulate(profile, plan)
    assert plan.predicted_peak_bytes == peak
    assert plan.feasible == (peak <= budget)
    assert plan.floor_bytes == max(node["peak_bytes"] for _, _, node in execution_order(profile))
    assert plan.forward_peak_bytes == forward_peak(profile)


@PROPERTY_SETTINGS
@given(profiles(), budgets)
def test_resident_set_is_the_longest_prefix_that_fits_beside_the_forward_peak(profile, budget):
    plan = make_plan(profile, budget)
    headroom = budget - forward_peak(profile)
    task_bytes = [task["bytes"] for task in profile["tasks"]]
    n_resident = len(task_bytes) - len(plan.offloaded)
    assert n_resident == 0 or sum(task_bytes[:n_resident]) <= headroom
    assert n_resident == len(task_bytes) or sum(task_bytes[:n_resident + 1]) > headroom


@PROPERTY_SETTINGS
@given(profiles(), st.sampled_from(["asap", "at_end"]))
def test_ample_budget_offloads_nothing_and_zero_budget_offloads_everything(profile, reload):
    floor = max(node["peak_bytes"] for _, _, node in execution_order(profile))
    total = sum(task["bytes"] for task in profile["tasks"])
    ample = make_plan(profile, floor + total, reload)
    assert ample.offloaded == [] and ample.feasible
    assert make_plan(profile, forward_peak(profile) + total, reload).offloaded == []
    nothing = make_plan(profile, 0, reload)
    assert nothing.offloaded == [task["id"] for task in profile["tasks"]] and nothing.resident_bytes == 0


@PROPERTY_SETTINGS
@given(profiles(), budgets, budgets, st.sampled_from(["asap", "at_end"]))
def test_more_budget_never_offloads_more(profile, budget_a, budget_b, reload):
    # Feasibility is not monotone (test_more_budget_can_lose_feasibility); the offloaded set is.
    small, large = sorted([budget_a, budget_b])
    plan_small, plan_large = make_plan(profile, small, reload), make_plan(profile, large, reload)
    assert set(plan_large.offloaded) <= set(plan_small.offloaded)


@PROPERTY_SETTINGS
@given(profiles(), budgets)
def test_reload_policies_trade_peak_for_earliness_not_feasibility(profile, budget):
    asap, at_end = make_plan(profile, budget, "asap"), make_plan(profile, budget, "at_end")
    assert asap.offloaded == at_end.offloaded
    assert asap.feasible == at_end.feasible
    assert at_end.predicted_peak_bytes <= asap.predicted_peak_bytes
    assert asap.predicted_peak_bytes <= max(at_end.predicted_peak_bytes, budget)
    last_bwd_peak = [node for _, bwd, node in execution_order(profile) if bwd][-1]["peak_bytes"]
    assert at_end.feasible == (budget >= max(at_end.floor_bytes + at_end.resident_bytes,
                                                last_bwd_peak + at_end.total_state_bytes))


@PROPERTY_SETTINGS
@given(profiles(), budgets)
def test_asap_reloads_fit_and_none_could_come_one_node_earlier(profile, budget):
    plan = make_plan(profile, budget, "asap")
    _, per_node = simulate(profile, plan)
    positions = {(graph_id, node["name"]): index
                 for index, (graph_id, bwd, node) in enumerate(execution_order(profile)) if bwd}
    bwd_order = sorted(positions.values())
    reload_positions = [positions[(reload.graph_id, reload.after_node)] for reload in plan.reloads]
    # Nodes that run with reloaded states on the device stay within budget.
    if reload_positions:
        assert all(cost <= budget for cost in per_node[reload_positions[0] + 1:])
    # The first task reloaded after each backward node (but the first) would overflow that node if it came
    # back one backward node earlier.
    nodes = execution_order(profile)
    for index, position in enumerate(reload_positions):
        if position == bwd_order[0] or (index and reload_positions[index - 1] == position):
            continue
        earlier = bwd_order[bwd_order.index(position) - 1]
        reloads = list(plan.reloads)
        reloads[index] = dataclasses.replace(reloads[index], graph_id=nodes[earlier][0],
                                             after_node=nodes[earlier][2]["name"])
        moved = dataclasses.replace(plan, reloads=reloads)
        assert simulate(profile, moved)[0] > budget


# ---------------------------------------------------------------- CLI


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.offload.plan", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)


UNPREDICTED = {"predicted_peak_bytes": None, "feasible": None}  # the small profile has no step model readings


@pytest.mark.slow
def test_cli_prints_the_plan(small_profile):
    result = run_cli("--profile", str(SMALL_PROFILE_PATH), "--budget-bytes", "80", "--reload", "at_end",
                     "--budget-rule", "deepspeed")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {**make_plan(small_profile, 80, "at_end").to_dict(), **UNPREDICTED}


@pytest.mark.slow
def test_cli_budget_gb_is_decimal(small_profile):
    result = run_cli("--profile", str(SMALL_PROFILE_PATH), "--budget-gb", "8e-8", "--budget-rule", "deepspeed")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {**make_plan(small_profile, 80).to_dict(), **UNPREDICTED}


CAPACITY_PROFILES = sorted((REPO_ROOT / "results" / "capacity" / "sweep").glob("*/profile.json"))


@pytest.mark.slow
@pytest.mark.skipif(not CAPACITY_PROFILES, reason="no capacity results committed")
def test_cli_on_a_profile_without_the_step_models_readings_says_so_in_one_line_and_predicts_nothing(tmp_path):
    # a profile as runs wrote it before the step model: a committed one less its step-model readings; DeepSpeed's
    # sizing still plans from the eager profile's peaks, the step model's rules refuse
    from harness.offload.profile import STEP_MODEL_READINGS

    written = json.loads(CAPACITY_PROFILES[0].read_text())
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({key: value for key, value in written.items() if key not in STEP_MODEL_READINGS}))
    budget = run_cli("--profile", str(profile), "--budget-gb", "12.8", "--budget-rule", "deepspeed")
    assert budget.returncode == 0, budget.stderr
    plan = json.loads(budget.stdout)
    assert plan["offloaded_bytes"] > 0 and (plan["predicted_peak_bytes"], plan["feasible"]) == (None, None)
    [line] = budget.stderr.splitlines()
    assert line.startswith("warning: ") and "measured_start_bytes" in line
    for args in (["--device-gb", "16"], ["--budget-gb", "12.8"]):  # the default rule, step_model
        refused = run_cli("--profile", str(profile), *args)  # these rules plan by the predicted peak
        assert refused.returncode == 2 and refused.stdout == ""
        [line] = refused.stderr.splitlines()
        assert line.startswith("profile: ") and "step_transient_bytes" in line


@pytest.mark.slow
def test_cli_plans_a_budget_by_the_rule_a_run_defaults_to(tmp_path):
    from test_plan_step_model import measured_profile

    default = yaml.safe_load((REPO_ROOT / "conf" / "offload" / "default.yaml").read_text())["budget_rule"]
    assert default == "step_model"
    profile = measured_profile(measured_start=100)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    result = run_cli("--profile", str(path), "--budget-bytes", "400")
    assert result.returncode == 0, result.stderr
    assert Plan.from_json(result.stdout) == plan_offload(profile, 400, None, default)


@pytest.mark.parametrize("args, key", [
    (["--profile", "missing.json", "--budget-gb", "1"], "profile"),
    (["--profile", str(SMALL_PROFILE_PATH), "--budget-gb", "-1", "--budget-rule", "deepspeed"], "offload.budget_gb"),
    (["--profile", str(SMALL_PROFILE_PATH), "--budget-bytes", "-1", "--budget-rule", "deepspeed"], "offload.budget_bytes"),
    (["--profile", str(SMALL_PROFILE_PATH), "--budget-gb", "1", "--reload", "sometimes", "--budget-rule", "deepspeed"], "offload.reload"),
    (["--profile", str(SMALL_PROFILE_PATH), "--budget-gb", "1", "--budget-bytes", "5"], "--budget-bytes"),
    (["--profile", str(SMALL_PROFILE_PATH)], "--budget-gb"),
])
@pytest.mark.slow
def test_cli_bad_input_is_one_line_naming_the_key(args, key):
    result = run_cli(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and key in lines[0]


@pytest.mark.slow
def test_cli_names_the_bad_key_inside_the_profile(tmp_path, small_profile):
    small_profile["tasks"][2]["bytes"] = -8
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(small_profile))
    result = run_cli("--profile", str(path), "--budget-gb", "1")
    assert result.returncode == 2
    assert result.stderr.startswith("profile.tasks[2].bytes: ")


# ---------------------------------------------------------------- ordered release


def test_ordered_release_frees_blocks_just_before_the_cap_would_be_exceeded():
    profile = two_graph_profile([10, 20, 30], [35, 5], {"a": 10, "b": 10, "c": 10})
    plan = make_plan(profile, 0, "asap", release="ordered", cap_bytes=50)
    # f0: 10 + 30 held = 40, f1: 20 + 30 = 50 fit; f2 is the last forward node, so it must also leave room for
    # the backward floor 35: 35 + 30 > 50 -> release a, b before f2 (35 + 10 = 45); c stays held.
    assert [(r.task, r.before_node) for r in plan.releases] == [("a", "f2"), ("b", "f2")]
    assert plan.held == ["c"] and plan.offloaded == ["a", "b", "c"]
    # reloads are placed under the cap too; the held c costs nothing
    assert reload_points(plan) == [("a", 0, "b0"), ("b", 0, "b0"), ("c", 0, "b0")]
    assert (plan.peak_cap_bytes, plan.predicted_peak_bytes) == (50, 50)


def test_reclaimed_release_waits_where_ordered_frees_and_predicts_recorded_release_peak():
    """release=reclaimed frees every block at the launch, as recorded does (same reloads, same predicted peak, nothing
    held), and waits for each copy where ordered release would free its block: where the forward needs it."""
    profile = two_graph_profile([10, 20, 30], [35, 5], {"a": 10, "b": 10, "c": 10})
    ordered = make_plan(profile, 0, "asap", release="ordered", cap_bytes=50)
    recorded = make_plan(profile, 0, "asap", release="recorded", cap_bytes=50)
    reclaimed = make_plan(profile, 0, "asap", release="reclaimed", cap_bytes=50)
    assert reclaimed.releases == ordered.releases == [Release("a", 0, False, "f2"), Release("b", 0, False, "f2")]
    assert reclaimed.held == [] and reclaimed.offloaded == recorded.offloaded
    assert reload_points(reclaimed) == reload_points(recorded)
    assert reclaimed.predicted_peak_bytes == recorded.predicted_peak_bytes
    assert reclaimed.release_policy == "reclaimed"


def test_recorded_release_lists_no_releases_and_holds_nothing(small_profile):
    plan = make_plan(small_profile, 0)
    assert plan.release_policy == "recorded" and plan.releases == [] and plan.held == []
    assert plan.peak_cap_bytes == plan.budget_bytes == 0


def test_a_cap_above_everything_releases_nothing(small_profile):
    plan = make_plan(small_profile, 0, release="ordered", cap_bytes=1000)
    assert plan.releases == [] and plan.held == TASK_IDS


def held_per_node(profile: dict, plan: dict) -> list[tuple[bool, int, int]]:
    """(is_bwd, node peak, bytes of held tasks) for every node, replaying the plan's releases."""
    task_bytes = {task["id"]: task["bytes"] for task in profile["tasks"]}
    held = sum(task_bytes[task_id] for task_id in plan.offloaded)
    rows = []
    for graph_id, bwd, node in execution_order(profile):
        held -= sum(task_bytes[r.task] for r in plan.releases
                    if not bwd and (r.graph_id, r.before_node) == (graph_id, node["name"]))
        rows.append((bwd, node["peak_bytes"], held))
    assert held == sum(task_bytes[task_id] for task_id in plan.held)
    return rows


@PROPERTY_SETTINGS
@given(profiles(), budgets, budgets, st.sampled_from(["asap", "at_end"]))
def test_ordered_releases_keep_the_forward_under_the_cap_whenever_anything_is_left_to_release(
        profile, budget, cap, reload):
    plan = make_plan(profile, budget, reload, release="ordered", cap_bytes=cap)
    released = [r.task for r in plan.releases]
    # released tasks are a prefix of the offloaded ones (launch order), the rest are held
    assert released + plan.held == plan.offloaded
    for bwd, peak, held in held_per_node(profile, plan):
        if not bwd and held:
            assert peak + plan.resident_bytes + held <= cap
    # the same budget offloads the same states whatever the release policy
    assert plan.offloaded == make_plan(profile, budget, reload).offloaded
    assert plan.predicted_peak_bytes >= max(peak + plan.resident_bytes + held
                                               for _, peak, held in held_per_node(profile, plan))
