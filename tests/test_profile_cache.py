"""Reuse across a sweep's points (harness/rank/profile_cache.py): the key, the graph fingerprint, and DeepCompile's
profiling runs skipped where an entry of the same key and graph is at hand, run and kept where not."""
from __future__ import annotations

import copy
import os

import pytest
import torch
import yaml
from omegaconf import OmegaConf
from torch.fx import symbolic_trace

from analysis.columns import is_design_column
from harness.config.compose import CONF_DIR, compose_point
from harness.contract import runfiles
from harness.driver.resume import CHANGEABLE
from harness.driver.validate import validate
from harness.rank import graph_ids, profile_cache
from harness.rank.profile_cache import ProfileCache, fingerprint, key_facts

VERSIONS = {"torch": "2.11.0", "cuda": "12.8", "deepspeed": "0.19.8", "device": "NVIDIA H100 80GB HBM3",
            "harness": {"git_sha": "abc123", "dirty_diff": ""}}


@pytest.fixture(scope="module")
def cfg() -> dict:
    return OmegaConf.to_container(compose_point(["arm=offload", "model=tiny"]), resolve=True)


def key_of(cfg, versions=VERSIONS) -> str:
    return profile_cache.digest(key_facts(cfg, versions))


def typed(cfg):
    """The typed config a rank reads from a validated config.yaml."""
    return validate(cfg, gpu_count=0)


def changed(cfg, group: str, name: str, value):
    other = copy.deepcopy(cfg)
    other[group][name] = value
    return other


def test_the_same_point_has_the_same_key_and_any_difference_it_depends_on_is_another(cfg):
    key = key_of(cfg)
    assert key_of(copy.deepcopy(cfg)) == key
    misses = [changed(cfg, "train", "seq_len", cfg["train"]["seq_len"] * 2),          # a shape
              changed(cfg, "train", "dtype", "fp32"),
              changed(cfg, "arm", "name", "ds_offload"),                                 # the arm
              changed(cfg, "offload", "compose", "prefetch"),                            # its schedule
              changed(cfg, "launcher", "nproc_per_node", 2),                             # the world size
              changed(cfg, "env", "device_memory_gb", 12.0),                             # the emulated device
              changed(cfg, "model", "config", {**cfg["model"]["config"], "num_hidden_layers": 3}),
              changed(cfg, "train", "repeat", 1)]                                        # repeats stay independent
    assert all(key_of(other) != key for other in misses)
    for name, value in (("torch", "2.13.0"), ("deepspeed", "0.19.9"), ("device", "NVIDIA H200")):
        assert key_of(cfg, {**VERSIONS, name: value}) != key
    for harness in ({"git_sha": "def456", "dirty_diff": ""}, {"git_sha": "abc123", "dirty_diff": "0f0f"}):
        assert key_of(cfg, {**VERSIONS, "harness": harness}) != key


def test_with_reuse_repeats_a_points_repeats_share_its_key_and_every_other_difference_is_still_another(cfg):
    """sweep.reuse_repeats (off by default, as the first test asserts): the repeat index leaves the key, nothing
    else does; a config.yaml written before the key existed keys its repeats apart, as they ran."""
    assert cfg["sweep"]["reuse_repeats"] is False and typed(cfg).sweep.reuse_repeats is False
    shared = changed(cfg, "sweep", "reuse_repeats", True)
    key = key_of(shared)
    assert key_of(changed(shared, "train", "repeat", 2)) == key != key_of(cfg)
    for group, name, value in (("train", "seq_len", cfg["train"]["seq_len"] * 2), ("arm", "name", "ds_offload"),
                               ("launcher", "nproc_per_node", 2), ("train", "seed", 7)):
        assert key_of(changed(shared, group, name, value)) != key, f"{group}.{name}"
    written_before = copy.deepcopy(cfg)
    del written_before["sweep"]["reuse_repeats"]
    assert key_of(changed(written_before, "train", "repeat", 1)) != key_of(written_before) == key_of(cfg)


def test_what_cannot_change_a_profile_keeps_the_key(cfg):
    key = key_of(cfg)
    for group, name, value in (("offload", "budget_gb", 3.0), ("offload", "budget_fraction", 0.5),
                               ("train", "measure_steps", 99), ("launcher", "timeout_s", 5.0)):
        assert key_of(changed(cfg, group, name, value)) == key, f"{group}.{name}"


class Net(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.linear(x)).to(torch.device("cpu"))


def graph(width: int = 4):
    module = symbolic_trace(Net(width))
    for node in module.graph.nodes:  # what DeepCompile's graphs carry: the output's shape
        node.meta["val"] = torch.empty(width) if node.op != "output" else None
    return module.graph


def test_the_fingerprint_names_a_graph_the_same_way_in_every_process_and_on_every_rank():
    assert fingerprint(graph()) == fingerprint(graph())
    assert fingerprint(graph(8)) != fingerprint(graph(4))  # another shape
    ranked = graph()
    for node in ranked.nodes:  # rank 1's graph runs on its own device, and its ops carry this process's graph id
        if node.op == "call_method":
            node.args = (node.args[0], torch.device("cuda", 1), 140234)
    reference = graph()
    for node in reference.nodes:
        if node.op == "call_method":
            node.args = (node.args[0], torch.device("cuda", 0), 990011)
    assert fingerprint(ranked, frozenset({140234})) == fingerprint(reference, frozenset({990011}))
    assert fingerprint(ranked, frozenset()) != fingerprint(reference, frozenset())  # a plain int stays itself


class FakeInterpreter:
    """What the wrapper reads of DeepCompile's interpreters: the graph, the device and the process group."""

    def __init__(self, fx_graph):
        self.graph, self.device, self.process_group = fx_graph, torch.device("cpu"), None
        self.mem_record, self.profile_complete = [], True


def profile_run(calls: list):
    """A profiling run as ProfilingInterpreter makes one: every node gets its profile metadata."""
    def run(interpreter, *args):
        calls.append(args)
        for position, node in enumerate(interpreter.graph.nodes):
            node.meta.update({name: position + 0.5 for name in profile_cache.PROFILE_META})
        return "outputs"
    return run


def memory_run(calls: list):
    def run(interpreter, *args):
        calls.append(args)
        for position, node in enumerate(interpreter.graph.nodes):
            node.meta.update(profile_mem_start=position, profile_mem_peak=10 * position)
        interpreter.mem_record = [(node.name, 1, 2, 3) for node in interpreter.graph.nodes]
    return run


def test_a_later_point_of_the_same_key_reuses_each_profiling_run_and_another_key_runs_its_own(tmp_path, cfg):
    phase = {"now": 0}
    facts = key_facts(cfg, VERSIONS)

    def point(point_facts, calls):
        cache = ProfileCache(tmp_path, point_facts, writes=True)
        seconds: dict = {}
        runs = {kind: profile_cache._wrapped(make(calls), kind, cache, lambda: phase["now"], seconds)
                for kind, make in (("profile", profile_run), ("memory", memory_run))}
        return cache, runs, seconds

    first_calls, later_calls, other_calls = [], [], []
    first, runs, seconds = point(facts, first_calls)
    cold = FakeInterpreter(graph())
    assert runs["profile"](cold, "inputs") == "outputs" and first_calls == [("inputs",)]
    runs["memory"](cold)
    phase["now"] = 1
    runs["profile"](FakeInterpreter(graph()))
    assert first.lookups == {0: {"hit": 0, "miss": 2}, 1: {"hit": 0, "miss": 1}}
    graph_print = fingerprint(graph(), profile_cache._graph_ids())  # each profiled graph, in order, per phase
    assert first.facts_for_worker()["graphs"] == {"0": [f"profile-{graph_print}", f"memory-{graph_print}"],
                                                  "1": [f"profile-{graph_print}"]}
    assert set(seconds) == {0, 1}  # the runs made, timed per phase

    later, runs, seconds = point(facts, later_calls)
    phase["now"] = 0
    warm = FakeInterpreter(graph())
    assert runs["profile"](warm, "inputs") is None and later_calls == []  # skipped: the entry is at hand
    runs["memory"](warm)
    kept = (*profile_cache.PROFILE_META, *profile_cache.MEMORY_META)
    assert [{name: node.meta[name] for name in kept} for node in warm.graph.nodes] \
        == [{name: node.meta[name] for name in kept} for node in cold.graph.nodes]
    assert warm.mem_record == cold.mem_record and warm.profile_complete
    runs["profile"](FakeInterpreter(graph()))  # a second profiling of the same graph in the phase: not yet kept
    assert later_calls == [()] and later.lookups[0] == {"hit": 2, "miss": 1} and seconds == {0: seconds[0]}

    other, runs, _ = point({**facts, "versions": {**VERSIONS, "torch": "2.13.0"}}, other_calls)
    runs["profile"](FakeInterpreter(graph()), "inputs")
    assert other.key != first.key and other_calls == [("inputs",)] and other.lookups[0] == {"hit": 0, "miss": 1}
    assert (tmp_path / profile_cache.CACHE_DIR / "profiles" / first.key / "key.json").is_file()


def test_an_incomplete_profiling_run_is_not_kept(tmp_path, cfg):
    cache = ProfileCache(tmp_path, key_facts(cfg, VERSIONS), writes=True)
    failed = FakeInterpreter(graph())

    def incomplete(interpreter):
        interpreter.profile_complete = False

    profile_cache._wrapped(incomplete, "memory", cache, lambda: 0, {})(failed)
    assert not list(cache.dir.glob("p0-*"))


def test_reuse_is_on_by_default(cfg):
    assert cfg["sweep"]["reuse"] is True


def test_stable_graph_ids_are_on_by_default_and_can_be_turned_off(cfg):
    """On since tests/test_offload_gpu.py -k stable passed on an H100 (2026-12-06, from 5fab67f)."""
    assert cfg["sweep"]["stable_graph_ids"] is True
    assert typed(cfg).sweep.stable_graph_ids is True
    off = compose_point(["arm=offload", "model=tiny", "sweep.stable_graph_ids=false"])
    assert OmegaConf.to_container(off, resolve=True)["sweep"]["stable_graph_ids"] is False


def test_stable_graph_ids_are_a_design_key_as_reuse_is():
    """Both change what a point's compiles cost: the analysis tells points apart by them, resume runs a point again
    where either differs, and an override of either names its folder."""
    hydra_conf = yaml.safe_load((CONF_DIR / "hydra" / "default.yaml").read_text())
    unnamed = hydra_conf["job"]["config"]["override_dirname"]["exclude_keys"]
    for key in ("sweep.reuse", "sweep.stable_graph_ids", "sweep.reuse_repeats"):
        assert is_design_column(key) and key not in CHANGEABLE and key not in unnamed, key


def test_reuse_needs_a_sweep_dir_and_the_knob(tmp_path, cfg, monkeypatch):
    # stable graph ids off (on by default): this test leaves DeepSpeed's backend as it is; the next one installs them
    cfg = typed(changed(changed(cfg, "sweep", "reuse", True), "sweep", "stable_graph_ids", False))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "unchanged")
    monkeypatch.setenv("TRITON_CACHE_DIR", "unchanged")
    sweep, run_dir = tmp_path / "sweep", tmp_path / "sweep" / "0_point"
    run_dir.mkdir(parents=True)
    assert profile_cache.open_for(cfg, run_dir, 0, None) is None  # a single run: no multirun.yaml above it
    (sweep / runfiles.MULTIRUN).write_text("{}")
    off = typed(changed(cfg.written, "sweep", "reuse", False))
    assert profile_cache.open_for(off, run_dir, 0, None) is None
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "unchanged"
    monkeypatch.setattr(profile_cache, "versions", lambda device_name: VERSIONS)
    cache = profile_cache.open_for(cfg, run_dir, 0, None)
    assert cache is not None and cache.dir.is_dir()
    inductor_dir = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    assert inductor_dir.startswith(str(sweep / profile_cache.CACHE_DIR))
    assert os.environ["TRITON_CACHE_DIR"].startswith(inductor_dir)
    assert cache.stable_graph_ids is False


def test_a_sweeps_cache_installs_stable_graph_ids_by_default_and_not_where_turned_off(tmp_path, cfg, monkeypatch):
    installs = []
    monkeypatch.setattr(graph_ids, "install", lambda: installs.append(True) or True)  # DeepSpeed's backend untouched
    monkeypatch.setattr(profile_cache, "versions", lambda device_name: VERSIONS)
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.setenv(name, "unchanged")  # open_for points them at the sweep's; undone after the test
    run_dir = tmp_path / "sweep" / "0_point"
    run_dir.mkdir(parents=True)
    (tmp_path / "sweep" / runfiles.MULTIRUN).write_text("{}")
    cache = profile_cache.open_for(typed(cfg), run_dir, 0, None)  # the defaults: reuse and stable graph ids on
    assert cache is not None and cache.stable_graph_ids is True and installs == [True]
    assert cache.facts_for_worker()["stable_graph_ids"] is True
    off = profile_cache.open_for(typed(changed(cfg, "sweep", "stable_graph_ids", False)), run_dir, 0, None)
    assert off is not None and off.stable_graph_ids is False and installs == [True]
    no_reuse = typed(changed(cfg, "sweep", "reuse", False))  # stable graph ids still on, but nothing is reused
    assert profile_cache.open_for(no_reuse, run_dir, 0, None) is None and installs == [True]


def test_a_python_function_in_a_graph_is_named_without_its_address():
    def made_in_a_process():  # each process makes its own function object, at its own address
        def scale(x):
            return x * 2
        return scale

    first, second = graph(), graph()
    for fx_graph in (first, second):
        output = next(node for node in fx_graph.nodes if node.op == "output")
        with fx_graph.inserting_before(output):
            fx_graph.call_function(made_in_a_process(), (output.args[0],))
    assert fingerprint(first) == fingerprint(second)
