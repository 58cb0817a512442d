"""Any value on any key of the schema, given as an override: the driver accepts it or refuses it with exactly one
`config error:` line (exit 2, or a `config_error` point in a sweep); never a traceback, never a file outside the sweep
dir. In process through the driver's own checks (fast, many values), and a few through the real driver (slow)."""
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf, open_dict

from conftest import TINY_RUN, driver_env, schema_keys
from harness.driver import app
from harness.cluster import nodes
from harness.config.compose import compose_point
from harness.contract.errors import ConfigError
from harness.contract.runfiles import read_jsonl

# arm._target_ is Hydra's key, not the schema's: the driver imports what it names (the user's own command line).
KEYS = sorted(schema_keys())
PLACE = nodes.NodePlace(0, 1, ("fuzz",))
NASTY = ["a/b", "../../../../esc", "..", "x\x00y", "tab\there", "é∕€ 😀", "a" * 300, "/" * 300, "%2F",
         "${oc.env:HARNESS_TEST_UNSET}", "${train.steps}", "${nope}", "${oc.decode:'['}", "${harness_dirname:}",
         1e300, -1e300, math.nan, math.inf, 10**13, -1, 0, True, None, [], [1, "a/b"], {"a": 1}, {"k": [1, "${x}"]}]
VALUES = st.one_of(
    st.sampled_from(NASTY),
    st.text(max_size=300),
    st.floats(),
    st.integers(),
    st.lists(st.one_of(st.integers(), st.text(max_size=8)), max_size=3),
    st.dictionaries(st.text("abcxyz_", min_size=1, max_size=5), st.one_of(st.integers(), st.text(max_size=8)),
                    max_size=2),
)


def hydra_value(value) -> str:
    """A Python value as Hydra's override grammar spells it (strings quoted, so `,` does not sweep)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ",".join(map(hydra_value, value)) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{hydra_value(item)}" for key, item in value.items()) + "}"
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def overrides_of(key: str, value, force: bool) -> list[str]:
    # `++` adds a key some options lack (model.config.rope_theta), so its value reaches the validation
    return [f"{'++' if force else ''}{key}={hydra_value(value)}"]


def point_folder(cfg) -> str:
    """The folder name a sweep gives this point (job 7)."""
    with open_dict(cfg):
        cfg.hydra.job.num = 7
    return OmegaConf.select(cfg, "hydra.sweep.subdir")


def driver_verdict(overrides: list[str]) -> str | None:
    """What the driver says to this command line up to the launch: None where it would launch, else its one line.
    Anything else it raises is a failure of the test."""
    try:
        app.check_command_line(overrides)
    except ConfigError as error:
        return f"config error: {error}"
    cfg = compose_point(overrides, with_hydra=True)
    folder = point_folder(cfg)
    assert "/" not in folder and "\x00" not in folder and ".." not in folder and len(folder.encode()) < 255, folder
    with open_dict(cfg):
        del cfg["hydra"]
    known, unresolved = app.resolved_or_written(cfg)
    try:
        if unresolved is not None:
            raise unresolved
        config = app.checked_config(known, PLACE)
    except ConfigError as error:
        app.build_summary(known, "config_error", str(error), [], 0.0, {})  # still recorded
        return f"config error: {error}"
    cmd, env = nodes.node_command(config.written, Path("/run dir"), PLACE)  # what Popen gets: text without NUL
    assert all(isinstance(part, str) and "\x00" not in part for part in [*cmd, *env.values()])
    app.build_summary(config.written, "ok", None, [], 0.0, {})
    return None


@pytest.mark.slow
@settings(max_examples=120, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(KEYS), value=VALUES, force=st.booleans())
def test_any_value_on_any_key_is_accepted_or_refused_in_one_line(key, value, force):
    verdict = driver_verdict(overrides_of(key, value, force))
    if verdict is not None:
        assert "\n" not in verdict and verdict.split(": ")[1], verdict


@pytest.mark.parametrize("key, value", [("env.pytorch_cuda_alloc_conf", "x\x00y"), ("sweep.name", "a/b"),
                                        ("env.device_memory_gb", 1e300), ("train.seq_len", "${oc.env:NOPE}")])
def test_the_nastiest_values_are_refused_naming_their_key(key, value):
    assert driver_verdict(overrides_of(key, value, force=False)).startswith(f"config error: {key}: ")


def files_outside(root: Path, sweep_dir: Path) -> list[Path]:
    return [path for path in root.rglob("*") if path.is_file() and sweep_dir not in path.parents]


@pytest.mark.slow
@settings(max_examples=5, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(KEYS), value=VALUES.filter(lambda v: "\x00" not in hydra_value(v)))  # argv holds no NUL
def test_the_real_driver_accepts_or_refuses_in_one_line_and_writes_only_inside_the_sweep(key, value):
    with tempfile.TemporaryDirectory() as root:
        root = Path(root)
        sweep_dir = root / "deep" / "down" / "sweep"
        cmd = [sys.executable, "-m", "harness.run", "-m", *TINY_RUN, "logger=none", "launcher.timeout_s=120",
               f"hydra.sweep.dir={sweep_dir}", *overrides_of(key, value, force=True)]
        proc = subprocess.run(cmd, cwd=root, env=driver_env(), capture_output=True, text=True, timeout=600)
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        errors = [line for line in proc.stderr.splitlines() if line.startswith("config error:")]
        if proc.returncode == 2:  # refused before Hydra started: nothing written
            assert proc.stderr.splitlines() == errors and len(errors) == 1
            assert not any(root.rglob("*"))
        else:
            assert proc.returncode == 0, proc.stderr[-3000:]
            [point] = read_jsonl(sweep_dir / "index.jsonl")
            assert len(errors) == (point["status"] == "config_error")
        assert files_outside(root, sweep_dir) == []
