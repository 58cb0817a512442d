"""One config schema: each group's dataclass is the single source of its keys' allowed values."""
import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Optional

import pytest
import yaml
from omegaconf import OmegaConf

from harness import arms
from analysis import bench
from harness.contract import schema
from harness.contract.checks import Choice, Number
from harness.config.compose import compose_point
from harness.contract.errors import ConfigError
from harness.offload import plan, runtime
from harness.contract.schema.fields import SOMETIMES, check_fields, rules

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFINITION_HOMES = (REPO_ROOT / "harness" / "contract" / "schema", REPO_ROOT / "harness" / "arms")


def allowed_value_lists() -> dict[str, frozenset]:
    """'offload.mode' -> {'async', 'blocking'}: every choice of two strings or more, in every group and arm."""
    found = {}

    def walk(prefix, cls):
        for name, rule in rules(cls).items():
            if isinstance(rule.check, type):
                walk(f"{prefix}.{name}", rule.check)
            elif isinstance(rule.check, Choice):
                strings = frozenset(option for option in rule.check.options if isinstance(option, str))
                if len(strings) >= 2:
                    found[f"{prefix}.{name}"] = strings

    for name, group in schema.GROUPS.items():
        walk(name, group)
    for arm_class in arms.registered().values():
        walk("arm", arm_class)
    return found


def value_lists_in(source: str, lists: dict[str, frozenset]) -> tuple[list[str], list[str]]:
    """(definitions, copies): a Literal[...] holding two or more values of one list defines it; a tuple, list or
    set that does is a copy; so is a table keyed by some but not all of a list's values (one keyed by all of them
    gives each value its behaviour, as cluster's bytes per dtype)."""
    tree = ast.parse(source)
    literal_slices = {id(node.slice) for node in ast.walk(tree)
                      if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "Literal"}
    definitions, copies = [], []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            continue
        items = node.keys if isinstance(node, ast.Dict) else node.elts
        strings = {item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)}
        for key, values in lists.items():
            if len(strings & values) < 2:
                continue
            if id(node) in literal_slices:
                definitions.append(key)
            elif not (isinstance(node, ast.Dict) and values <= strings):
                copies.append(f"{node.lineno}: {key}")
    return definitions, copies


LISTS = {"offload.mode": frozenset({"async", "blocking"}), "train.dtype": frozenset({"bf16", "fp16", "fp32"})}


@pytest.mark.parametrize("snippet,copies", [
    ('MODES = ("async", "blocking")', ["1: offload.mode"]),
    ('ok = mode in ["blocking", "async"]', ["1: offload.mode"]),
    ('SIZES = {"bf16": 2, "fp16": 2}', ["1: train.dtype"]),
    ('SIZES = {"bf16": 2, "fp16": 2, "fp32": 4}', []),
    ('mode: Literal["async", "blocking"]', []),
    ('if mode == "async": pass', []),
])
def test_the_search_tells_definitions_from_copies(snippet, copies):
    definitions, found = value_lists_in(snippet, LISTS)
    assert found == copies
    assert definitions == (["offload.mode"] if "Literal" in snippet else [])


def test_each_allowed_value_list_is_written_once():
    lists = allowed_value_lists()
    assert {"offload.mode", "offload.reload", "train.dtype", "debug.fault", "arm.schedule"} <= set(lists)
    definitions, copies = [], {}
    for path in sorted(p for top in ("harness", "analysis") for p in (REPO_ROOT / top).rglob("*.py")):
        defined, copied = value_lists_in(path.read_text(), lists)
        if any(home in path.parents for home in DEFINITION_HOMES):
            definitions += defined
        if copied:
            copies[str(path.relative_to(REPO_ROOT))] = copied
    assert copies == {}, "read allowed values from harness.contract.schema.choices"
    assert sorted(definitions) == sorted(lists)  # each one Literal, in the schema or its arm


def composed(*overrides: str) -> dict:
    return OmegaConf.to_container(compose_point(list(overrides)), resolve=True)


@pytest.mark.parametrize("overrides", [[], ["launcher=slurm"], ["logger=none"], ["model=qwen3_8b"]])
def test_every_key_of_every_group_has_a_field_and_every_field_a_key(overrides):
    cfg = composed(*overrides)
    assert set(cfg) == {"arm", *schema.GROUPS}

    def compare(prefix, cls, values):
        fields = rules(cls)
        assert set(values) <= set(fields), f"{prefix}: keys without a schema field"
        required = {name for name, rule in fields.items() if not rule.sometimes}
        assert required <= set(values), f"{prefix}: schema fields without a key"
        for name, rule in fields.items():
            if isinstance(rule.check, type):
                compare(f"{prefix}.{name}", rule.check, values[name])

    for name, group in schema.GROUPS.items():
        compare(name, group, cfg[name])


@pytest.mark.slow
def test_the_offload_pass_the_planner_and_bench_read_their_choices_from_the_schema():
    assert runtime.MODES == schema.choices(schema.OffloadConfig, "mode")
    assert runtime.EMPTY_CACHE_POLICIES == schema.choices(schema.OffloadConfig, "empty_cache")
    assert (plan.RELOAD_POLICIES, plan.RELEASE_POLICIES) == \
        (schema.choices(schema.OffloadConfig, "reload"), schema.choices(schema.OffloadConfig, "release"))
    defaults = yaml.safe_load((REPO_ROOT / "conf" / "offload" / "default.yaml").read_text())
    assert bench.KNOBS == schema.pass_knobs() and set(bench.KNOBS) < set(defaults)
    assert not set(bench.KNOBS) & set(rules(schema.BudgetConfig))
    usage = subprocess.run([sys.executable, "-m", "harness.offload.plan", "--help"], capture_output=True, text=True,
                           cwd=REPO_ROOT).stdout
    assert " | ".join(plan.RELOAD_POLICIES) in " ".join(usage.split())


@dataclass(frozen=True)
class Example:
    count: Annotated[int, Number(low=0, integer=True)]
    cap_gb: Annotated[Optional[float], Number(low=0, low_open=True)]
    mode: Literal["fast", "slow"]
    fault: Optional[Literal["kill", "hang"]]
    flag: Optional[bool]
    extra: Annotated[bool, SOMETIMES]
    note: str


@pytest.mark.parametrize("values,error", [
    ({"count": -1}, "x.count: must be an integer >= 0, got -1"),
    ({"cap_gb": 0}, "x.cap_gb: must be null or a finite number > 0, got 0"),
    ({"mode": "medium"}, "x.mode: must be one of fast, slow, got 'medium'"),
    ({"fault": "oom"}, "x.fault: must be one of null, kill, hang, got 'oom'"),
    ({"flag": 1}, "x.flag: must be one of null, true, false, got 1"),
    ({"extra": "yes"}, "x.extra: must be one of true, false, got 'yes'"),
    ({"mode": None}, "x.mode: must be one of fast, slow, got None"),
    ({"note": 3}, "x.note: must be a string without control characters, got 3"),
    ({"note": "a\x00b"}, "x.note: must be a string without control characters, got 'a\\x00b'"),
    ({"count": 10**13}, "x.count: must be an integer >= 0 and at most 1e+12 in size, got 10000000000000"),
    ({"cap_gb": 1e300}, "x.cap_gb: must be null or a finite number > 0 and at most 1e+12 in size, got 1e+300"),
    ({"nte": "typo"}, "x.nte: unknown key; x has count, cap_gb, mode, fault, flag, extra, note"),
])
def test_a_field_type_says_what_it_allows(values, error):
    good = {"count": 0, "cap_gb": None, "mode": "fast", "fault": None, "flag": True, "note": "free text"}
    check_fields("x", Example, good)  # extra is left out: only some options have it
    with pytest.raises(ConfigError) as refused:
        check_fields("x", Example, {**good, **values})
    assert str(refused.value) == error


def test_a_required_key_that_is_absent_is_refused_as_missing():
    with pytest.raises(ConfigError) as refused:
        check_fields("x", Example, {"count": 0, "cap_gb": None, "fault": None, "flag": None})
    assert str(refused.value) == "x.mode: missing"
    with pytest.raises(TypeError):
        schema.choices(Example, "count")


def test_a_new_knob_is_one_field_line():
    @dataclass(frozen=True)
    class DebugWithDelay(schema.DebugConfig):
        copy_delay_us: Annotated[int, Number(low=0, integer=True)]

    debug = {**composed()["debug"], "copy_delay_us": 0}
    check_fields("debug", DebugWithDelay, debug)
    with pytest.raises(ConfigError) as refused:
        check_fields("debug", DebugWithDelay, {**debug, "copy_delay_us": -5})
    assert refused.value.key == "debug.copy_delay_us"


def test_every_offload_key_is_an_analysis_column_named_by_the_schema():
    """A config key's column comes from the schema, so a new offload knob cannot be missing from the report."""
    from analysis.columns import CONFIG_COLUMNS
    from harness.contract.schema.fields import rules

    assert {f"offload.{key}" for key in rules(schema.OffloadConfig)} <= set(CONFIG_COLUMNS)
    assert CONFIG_COLUMNS["offload.evict_from"] == "evict_from" and CONFIG_COLUMNS["offload.mode"] == "offload_mode"


def test_the_log_level_is_a_choice_with_info_by_default():
    defaults = yaml.safe_load((Path(__file__).resolve().parents[1] / "conf/launcher/local.yaml").read_text())
    assert defaults["log_level"] == "INFO"
    assert schema.choices(schema.LauncherConfig, "log_level") == ("DEBUG", "INFO", "WARNING", "ERROR")
    with pytest.raises(ConfigError) as error:
        check_fields("launcher", schema.LauncherConfig, {**defaults, "log_level": "LOUD"})
    assert error.value.key == "launcher.log_level"


def test_a_validated_config_reads_typed_with_its_arm_and_keeps_the_dict_as_written():
    from harness.driver.validate import validate

    written = OmegaConf.to_container(compose_point(["model=tiny", "arm=offload", "offload.budget_gb=3",
                                                    "launcher.nproc_per_node=2"]), resolve=True)
    written["launcher"].pop("requeue")  # a key only some launchers have
    config = validate(written, gpu_count=0)
    assert isinstance(config.arm, arms.from_config(written["arm"]).__class__) and config.arm.name == "offload"
    assert config.offload == schema.OffloadConfig(**written["offload"]) and config.offload.budget_gb == 3
    assert config.model.config.hidden_size == written["model"]["config"]["hidden_size"]  # a nested section
    assert config.launcher.requeue is None and config.world_size == 2
    assert config.written is written
    with pytest.raises(AttributeError):  # frozen: the config a point runs is the one config.yaml holds
        config.train.steps = 1
