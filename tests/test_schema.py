"""One config schema: each group's dataclass is the single source of its keys' allowed values."""
from dataclasses import dataclass
from typing import Annotated, Literal, Optional

import pytest
from omegaconf import OmegaConf

from harness import schema
from harness.checks import Number
from harness.cluster import compose_point
from harness.errors import ConfigError
from harness.schema.fields import SOMETIMES, check_fields, rules



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
])
def test_a_field_type_says_what_it_allows(values, error):
    good = {"count": 0, "cap_gb": None, "mode": "fast", "fault": None, "flag": True, "note": 3}
    check_fields("x", Example, good)  # extra is left out: only some options have it; note is free text
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
