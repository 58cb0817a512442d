"""Helpers shared by the test modules: the driver run as a user would run it, a run dir's records, the
bad inputs refused with one line naming their key, and the figure checks."""
import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.contract.runfiles import read_jsonl

REPO_ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HARNESS_ROOT", str(REPO_ROOT))

TINY_RUN = ["model=tiny", "train.warmup_steps=0", "train.measure_steps=3", "train.seq_len=32"]  # 4 steps: seconds on CPU
SLURM_KEYS = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_NODEID",
              "SLURM_PROCID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT", "SLURM_JOB_END_TIME")
# Values out of range, each refused before launch with one line naming the key: checked in process and
# through the driver.
BAD_VALUES = [
    (["train.steps=0"], "train.steps"),
    (["train.micro_batch=0"], "train.micro_batch"),
    (["offload.budget_gb=-2"], "offload.budget_gb"),
    (["arm=ds_offload", "arm.offload_optimizer=cpu"], "arm.offload_optimizer"),
    (["train.gc=sometimes"], "train.gc"),
]


def pytest_collection_modifyitems(config, items):
    """GPU tests skip cleanly where CUDA is missing (they run there with `pytest -m gpu`)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def starts_python(args) -> bool:
    """Whether a subprocess command line starts a Python interpreter (the driver, a CLI, a notebook's kernel)."""
    program = os.fspath(args if isinstance(args, (str, bytes, os.PathLike)) else args[0])
    program = program.decode() if isinstance(program, bytes) else program
    return program == sys.executable or Path(program.split()[0]).name.startswith("python")


FAST_TEST: list[str] = []  # the node id of the fast-tier test being set up, run or torn down, if any
_execute_child = subprocess.Popen._execute_child


def _execute_child_outside_the_fast_tier(self, args, *rest, **kwargs):
    """The fast tier (`pytest -m "not slow and not gpu"`) stays fast: a test that starts Python in a subprocess
    (the driver, a CLI, a notebook's kernel), in its body or in a fixture it sets up, must be marked `slow` (or
    `gpu`: that tier runs on a GPU machine alone), and fails here if it is not. Patched on Popen's class, so modules that imported Popen by name are guarded too."""
    if FAST_TEST and starts_python(args):
        pytest.fail(f"{FAST_TEST[0]} starts Python in a subprocess ({args!r:.120}): mark it slow", pytrace=False)
    return _execute_child(self, args, *rest, **kwargs)


subprocess.Popen._execute_child = _execute_child_outside_the_fast_tier


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not (item.get_closest_marker("slow") or item.get_closest_marker("gpu")):
        FAST_TEST.append(item.nodeid)
    try:
        yield
    finally:
        FAST_TEST.clear()


@pytest.fixture
def run_file_mode() -> int:
    """The mode every run file gets under this process's umask (0644 under the usual 022)."""
    from harness.contract.runfiles import RUN_FILE_MODE

    umask = os.umask(0)
    os.umask(umask)
    return RUN_FILE_MODE & ~umask


def schema_keys() -> dict[str, object]:
    """Every leaf key of the config schema (the arm group's as the default arm, zero3, has them) -> its check."""
    from harness import arms
    from harness.contract import schema
    from harness.contract.schema.fields import rules

    def leaves(prefix: str, group: type) -> dict[str, object]:
        found = {}
        for name, rule in rules(group).items():
            if isinstance(rule.check, type):
                found.update(leaves(f"{prefix}.{name}", rule.check))
            else:
                found[f"{prefix}.{name}"] = rule.check
        return found

    keys = leaves("arm", arms.registered()["zero3"])
    for name, group in schema.GROUPS.items():
        keys.update(leaves(name, group))
    return keys


def driver_env(**slurm: str) -> dict[str, str]:
    """This environment without the machine's own SLURM variables (a test sets those it fakes)."""
    env = {key: value for key, value in os.environ.items() if key not in SLURM_KEYS}
    # This checkout's code first, wherever the package is installed from (the subprocess's cwd is a test's folder).
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return {**env, "PYTHONPATH": path, "WANDB_SILENT": "true", **slurm}


def harness_cmd(tmp_path: Path, *overrides: str, multirun: bool = False, fast: list[str] = TINY_RUN,
                config_dir: Path | None = None) -> list[str]:
    """The driver's command line as a user would type it; run/sweep dirs go under tmp_path."""
    dirs = [f"hydra.run.dir={tmp_path}/run", f"hydra.sweep.dir={tmp_path}/sweep"]
    added = ["--config-dir", str(config_dir)] if config_dir else []  # Hydra's flags come before the overrides
    return [sys.executable, "-m", "harness.run", *added, *(["-m"] if multirun else []), *fast, *dirs, *overrides]


def harness_run(tmp_path: Path, *overrides: str, multirun: bool = False, fast: list[str] = TINY_RUN,
                timeout: int = 600, config_dir: Path | None = None, env: dict | None = None,
                **slurm: str) -> subprocess.CompletedProcess:
    """`env`: the whole environment (default: this one without SLURM's variables, plus `slurm`)."""
    return subprocess.run(harness_cmd(tmp_path, *overrides, multirun=multirun, fast=fast, config_dir=config_dir),
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
                          env=env or driver_env(**slurm))


def replace_launch(monkeypatch, wall_time_s: float = 1.0) -> list[Path]:
    """The driver's record_point without Hydra's runtime or ranks: the earlier attempt is set aside as start_attempt
    does, and the launch writes env.json as run_point does and ends `died` under debug.fault=kill, else `ok`, after
    `wall_time_s`. Returns the run dirs launched."""
    from harness.contract import runfiles
    from harness.contract.envinfo import collect_env
    from harness.driver import app

    launched: list[Path] = []

    def run_point(config, run_dir, place):
        launched.append(run_dir)
        runfiles.write_json(run_dir / runfiles.ENV, collect_env(config, run_dir)[0])
        status = "died" if config.debug.fault == "kill" else "ok"
        return app.build_summary(config.written, status, None, [], wall_time_s, {})

    monkeypatch.setattr(app, "start_attempt", lambda run_dir, cfg: runfiles.set_aside_previous_attempt(run_dir))
    monkeypatch.setattr(app, "run_point", run_point)
    monkeypatch.setattr(app.console, "phase_table", lambda summary: None)
    return launched


def read_run(run_dir: Path) -> tuple[list[dict], dict]:
    """A run dir's steps.jsonl rows and summary.json."""
    return read_jsonl(run_dir / "steps.jsonl"), json.loads((run_dir / "summary.json").read_text())


@contextlib.contextmanager
def unwritable(folder: Path):
    """`folder` made unwritable for this process for the block: no write permission, and for root (whom permissions
    do not stop) the filesystem's immutable flag; the test is skipped where neither holds."""
    folder.chmod(0o555)
    immutable = False
    try:
        if os.access(folder, os.W_OK):
            immutable = subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0 \
                if shutil.which("chattr") else False
            if not immutable:
                pytest.skip("cannot make a folder unwritable for this user here")
        yield folder
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(0o755)


@pytest.fixture
def close_figures():
    """Close every figure a test made (figures stay open until closed, and many slow the suite)."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def lies_inside(extent, bounds, slack: float = 0.5) -> bool:
    """Whether a drawn artist's extent lies within bounds (both in the same units), to half a unit."""
    return (extent.x0 >= bounds.x0 - slack and extent.y0 >= bounds.y0 - slack and extent.x1 <= bounds.x1 + slack
            and extent.y1 <= bounds.y1 + slack)
