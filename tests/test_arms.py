"""Arms are objects: one class per arm, picked by conf/arm/NAME.yaml; no code outside harness/arms/ tells arms
apart by their names."""
import ast
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from analysis import capacity, plots, tables
from conftest import driver_env
from harness import arms
from harness.arms.registry import TARGET
from harness.config.compose import compose_point
from harness.contract.errors import ConfigError
from harness.driver.validate import validate

REPO_ROOT = Path(__file__).resolve().parent.parent
ARM_PACKAGE = REPO_ROOT / "harness" / "arms"
ARM_NAMES = frozenset(arms.registered())


def config(*overrides: str) -> dict:
    return OmegaConf.to_container(compose_point(list(overrides)), resolve=True)


def _arm_names_in(node: ast.AST) -> set[str]:
    """Arm names that a node spells as string constants: itself, or the items or keys of a literal collection."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = node.elts
    elif isinstance(node, ast.Dict):
        items = node.keys
    else:
        items = [node]
    return {item.value for item in items if isinstance(item, ast.Constant) and item.value in ARM_NAMES}


def arm_name_tests(source: str) -> list[str]:
    """Code that tells arms apart by name: a comparison or `case` with an arm name, or a literal collection naming
    two arms or more (a list of arms, a table keyed by arm)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            hit = any(_arm_names_in(operand) for operand in (node.left, *node.comparators))
        elif isinstance(node, ast.MatchValue):
            hit = bool(_arm_names_in(node.value))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            hit = len(_arm_names_in(node)) >= 2
        else:
            continue
        if hit:
            found.append(f"{node.lineno}: {ast.get_source_segment(source, node)}")
    return found


@pytest.mark.parametrize("snippet", [
    'if arm == "offload": pass', 'ok = "zero_offload" != name', 'x = arm in ("ds_offload", "deepcompile")',
    'bases = ["zero3", "deepcompile"]', 'STYLES = {"zero3": 1, "offload": 2}', 'flag = name not in {"zero3"}',
    'match arm:\n    case "deepcompile": pass',
])
def test_the_search_finds_arm_names_compared_or_listed(snippet):
    assert arm_name_tests(snippet)


@pytest.mark.parametrize("snippet", [
    'cfg["offload"]["budget_gb"]', 'if mode == "async": pass',
    'GROUPS = {"offload": "conf/offload", "arm": "conf/arm"}',
    'path = root / "conf" / "offload"', '"""zero3 and deepcompile are compared"""',
])
def test_the_search_leaves_other_strings_alone(snippet):
    assert not arm_name_tests(snippet)


def test_no_module_outside_the_arm_package_tells_arms_apart_by_name():
    sources = [path for top in ("harness", "analysis") for path in sorted((REPO_ROOT / top).rglob("*.py"))
               if ARM_PACKAGE not in path.parents]
    assert len(sources) > 20
    found = {str(path.relative_to(REPO_ROOT)): hits for path in sources
             if (hits := arm_name_tests(path.read_text()))}
    assert found == {}, "select arms by their traits (harness/arms/) instead"


@pytest.mark.parametrize("name", sorted(ARM_NAMES))
def test_each_arm_yaml_names_its_class_and_sets_exactly_its_knobs(name):
    raw = yaml.safe_load((REPO_ROOT / "conf" / "arm" / f"{name}.yaml").read_text())
    arm_class = arms.registered()[name]
    assert raw[TARGET] == f"{arm_class.__module__}.{arm_class.__qualname__}"
    assert arm_class.__module__ == f"harness.arms.{name}"  # one module per arm
    assert set(raw) - {TARGET} == {field.name for field in fields(arm_class)}


def test_a_run_dir_from_before_target_finds_its_arm_by_name():
    assert arms.class_of({"name": "zero3"}) is arms.registered()["zero3"]
    assert type(arms.from_config({"name": "zero3", "phase_starts": [0, 2], "offload_optimizer": None})) \
        is arms.registered()["zero3"]
    with pytest.raises(ConfigError) as unknown:
        arms.class_of({"name": "zero4"})
    assert unknown.value.key == "arm.name"


@pytest.mark.parametrize("target", ["nowhere.Arm", "harness.arms.zero3.Nothing", "harness.contract.errors.ConfigError", "x"])
def test_a_target_that_is_no_arm_class_is_refused_naming_the_key(target):
    with pytest.raises(ConfigError) as error:
        validate(config(f"arm.{TARGET}={target}"), gpu_count=0)
    assert error.value.key == f"arm.{TARGET}"


def test_an_arm_missing_a_knob_is_refused_naming_it():
    cfg = config("arm=deepcompile")
    del cfg["arm"]["schedule"]
    with pytest.raises(ConfigError) as error:
        validate(cfg, gpu_count=0)
    assert error.value.key == "arm.schedule"


@pytest.mark.parametrize("name", sorted(ARM_NAMES))
def test_each_arm_builds_a_zero3_config_and_only_compiled_arms_compile(name):
    cfg = config(f"arm={name}")
    typed = validate(cfg, gpu_count=0)
    arm = typed.arm
    ds_config = arm.deepspeed_config(typed, cuda=False)
    assert ds_config["zero_optimization"]["stage"] == 3
    assert ("compile" in ds_config) == isinstance(arm, arms.CompiledArm) == arm.needs_cuda
    if "compile" in ds_config:  # DeepSpeed's own pass only for the arm that is DeepSpeed's pass
        assert ds_config["compile"]["offload_opt_states"] == (arm.bench_role == arms.BenchRole.PEER)
    cpu_optimizer = "offload_optimizer" in ds_config["zero_optimization"]
    assert cpu_optimizer == (cfg["arm"]["offload_optimizer"] == "cpu")
    assert arm.keeps_optimizer_states_on_gpu == (not cpu_optimizer and not arm.offloads_opt_states)


def test_an_eager_arm_phases_come_from_its_phase_starts():
    typed = validate(config("arm=zero3", "arm.phase_starts=[0,3]"), gpu_count=0)
    assert typed.arm.compile(typed, engine=None, budget_bytes=None, run_dir="") == [0, 3]


@pytest.mark.parametrize("overrides", [["arm=zero3"], ["arm=deepcompile"], ["arm=ds_offload"],
                                       ["arm=ds_offload", "arm.variant=sync"], ["arm=offload"],
                                       ["arm=offload", "offload.mode=blocking"],
                                       ["arm=offload", "offload.release=ordered", "offload.peak_cap_gb=12",
                                        "offload.budget_rule=deepspeed"]])
def test_every_arm_accepts_gradient_accumulation(overrides):
    typed = validate(config(*overrides, "train.grad_accum=4"), gpu_count=0)
    assert typed.arm.deepspeed_config(typed, cuda=True)["gradient_accumulation_steps"] == 4


def test_deepspeeds_pass_counts_a_cycle_per_scheduled_states_launched(monkeypatch):
    """DeepSpeed's op stats count one launch per scheduled state each time its graphs run: with accumulation 4 a
    steady step launches every state 4 times, and offload_cycles says 4; the sync variant's Python moves are not
    counted, so it reports no cycles."""
    from deepspeed.compile.passes import offload_adam_states as ds_pass

    cfg = config("arm=ds_offload", "train.grad_accum=4")
    read = arms.from_config(cfg["arm"]).offload_counter_reader()
    stats = {"launches": 5, "reloads": 0}  # a compile step's profiling ran some of the ops
    monkeypatch.setattr(ds_pass, "_offload_op_stats", stats)
    monkeypatch.setattr(ds_pass, "offload_tasks_scheduled", [("task", index) for index in range(3)])
    before = read()
    stats.update(launches=stats["launches"] + 3 * 4, reloads=3 * 4)
    after = read()
    assert after["offload_cycles"] - before["offload_cycles"] == 4
    assert after["offload_launches"] - before["offload_launches"] == 12
    sync = arms.from_config(config("arm=ds_offload", "arm.variant=sync")["arm"]).offload_counter_reader()
    assert "offload_cycles" not in sync()


def test_analysis_takes_its_arm_orders_and_roles_from_the_arm_classes():
    registered = arms.registered()
    assert sorted(tables.ARMS) == sorted(capacity.CAPACITY_ARMS) == sorted(ARM_NAMES)
    assert [registered[name].display.table_order for name in tables.ARMS] == \
        sorted(arm.display.table_order for arm in registered.values())
    pr8186_rows = ("zero3", "zero_offload", "deepcompile", "ds_offload", "offload")
    assert capacity.CAPACITY_ARMS == pr8186_rows
    assert registered[tables.BASELINE_ARM].baseline
    assert set(tables.OFFLOAD_ARMS) == {name for name, arm in registered.items() if arm.offloads_opt_states}
    assert not set(tables.NON_OFFLOAD_ARMS) & set(tables.OFFLOAD_ARMS)
    assert plots.ARM_STYLES == {name: (arm.display.colour, arm.display.marker) for name, arm in registered.items()}
    assert plots.arm_style("an arm no longer in conf") == plots.OTHER_ARM_STYLE


def test_a_target_is_looked_up_never_imported_unless_the_driver_admits_it(monkeypatch):
    monkeypatch.delenv(arms.ADMITTED_ENV, raising=False)
    target = "json.JSONDecoder"  # importable, and no arm: looking it up must not even try
    with pytest.raises(ConfigError) as unknown:
        arms.class_of({TARGET: "harness_planted_nowhere.Arm", "name": "zero3"})
    assert unknown.value.key == f"arm.{TARGET}" and "unknown arm class" in unknown.value.message
    assert "harness_planted_nowhere" not in sys.modules
    with pytest.raises(ConfigError) as admitted:  # the driver imports what its own command line names...
        arms.admit({TARGET: target})
    assert "not a subclass of harness.arms.Arm" in admitted.value.message  # ...and still refuses a non-arm



def test_a_lookup_never_imports_the_handed_class_only_the_rank_admits_it(monkeypatch):
    target = "harness_planted_nowhere_handed.Arm"  # no such module: an import would raise ModuleNotFoundError
    monkeypatch.setenv(arms.ADMITTED_ENV, target)
    with pytest.raises(ConfigError) as unknown:  # a reader in a process that has the variable still only looks up
        arms.class_of({TARGET: target, "name": "zero3"})
    assert "unknown arm class" in unknown.value.message
    arms.admit_handed({TARGET: "json.JSONDecoder"})  # a class the driver did not hand over is left alone
    assert "json.JSONDecoder" not in arms.registry._admitted
    with pytest.raises(ConfigError) as handed:  # the rank imports the handed class its config names
        arms.admit_handed({TARGET: target})
    assert "harness_planted_nowhere_handed" in handed.value.message

HALVES = """
from dataclasses import dataclass

from harness.arms import EagerArm


@dataclass(frozen=True)
class Halves(EagerArm):
    pass
"""


@pytest.mark.slow
def test_an_arm_installed_as_an_entry_point_is_known_to_every_reader(tmp_path):
    (tmp_path / "halves_arm.py").write_text(HALVES)
    dist_info = tmp_path / "halves_arm-0.1.dist-info"  # what `pip install` of a package declaring it leaves
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: halves-arm\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[offload_harness.arms]\nhalves = halves_arm:Halves\n")
    code = ("from harness import arms; print(arms.registered()['halves'].__name__, "
            "arms.class_of({'_target_': 'halves_arm.Halves', 'name': 'halves'}).__name__)")
    path = os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-c", code], env={**driver_env(), "PYTHONPATH": path},
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["Halves", "Halves"], proc.stderr
