"""The SLURM path against a real scheduler: sweeps submitted with `launcher=slurm` to the cluster that
tests/slurm_cluster.py starts on this host (slurmctld, two slurmd, slurmdbd). Time limits, preemption, requeue,
two-node points and jobs that end without a result, as SLURM itself delivers them."""
import json
import shutil
import subprocess
import tempfile
import time
from functools import partial
from pathlib import Path

import pytest

import conftest
from conftest import driver_env
from harness.runfiles import read_jsonl
from slurm_cluster import Cluster, ClusterUnavailable

pytestmark = pytest.mark.slurm

FAST = ["model=tiny", "train.seq_len=32", "logger=none", "launcher=slurm", "launcher.nproc_per_node=1"]
harness_cmd = partial(conftest.harness_cmd, fast=FAST, multirun=True)


@pytest.fixture(scope="session")
def slurm_cluster():
    """One cluster for the session, whatever the tests' outcome stopped at the end (every daemon by its pid)."""
    root = Path(tempfile.mkdtemp(prefix="slurm-"))  # not under pytest's private tmp: munged's socket must be reachable
    cluster = Cluster(root)
    try:
        cluster.start()
    except ClusterUnavailable as error:
        pytest.skip(f"slurm: {error}")
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


class Sweep:
    """A `launcher=slurm` sweep submitted from tmp_path, as a user would run it."""

    def __init__(self, cluster: Cluster, tmp_path: Path, *overrides: str):
        self.cluster, self.dir = cluster, tmp_path / "sweep"
        self.proc = subprocess.Popen(harness_cmd(tmp_path, *overrides), cwd=tmp_path, text=True,
                                     env=driver_env(SLURM_CONF=cluster.env["SLURM_CONF"]),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def finish(self, timeout: float = 300) -> str:
        """Wait for the submitting process; its output."""
        try:
            return self.proc.communicate(timeout=timeout)[0]
        except subprocess.TimeoutExpired:
            self.proc.kill()
            output = self.proc.communicate()[0]
            pytest.fail(f"the sweep did not end within {timeout:.0f} s:\n{output[-3000:]}")

    def index(self) -> list[dict]:
        return read_jsonl(self.dir / "index.jsonl")

    def run_dir(self, point: int) -> Path:
        return next(self.dir.glob(f"{point}_*"))

    def summary(self, point: int) -> dict:
        return json.loads((self.run_dir(point) / "summary.json").read_text())

    def steps(self, point: int) -> list[dict]:
        return read_jsonl(self.run_dir(point) / "steps.jsonl")

    def jobs(self) -> dict[int, str]:
        """Job id of each point (array task index -> ARRAY_TASK), once SLURM has them."""
        out = self.cluster.slurm(["squeue", "-h", "-r", "-t", "all", "-o", "%i"]).stdout.split()
        return {int(job.split("_")[1]): job for job in out if "_" in job} or {0: out[0]} if out else {}

    def wait_for_steps(self, point: int, count: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            run_dirs = list(self.dir.glob(f"{point}_*"))
            if run_dirs and len(read_jsonl(run_dirs[0] / "steps.jsonl")) >= count:
                return
            time.sleep(0.5)
        pytest.fail(f"point {point} wrote no {count} steps within {timeout:.0f} s:\n{self.finish(10)[-3000:]}")


def test_a_two_point_sweep_runs_both_points_and_writes_its_index(slurm_cluster, tmp_path):
    sweep = Sweep(slurm_cluster, tmp_path, "train.steps=3", "train.micro_batch=1,2")
    output = sweep.finish()
    assert sweep.proc.returncode == 0, output[-3000:]
    assert [line["status"] for line in sweep.index()] == ["ok", "ok"]
    for point in (0, 1):
        assert len(sweep.steps(point)) == 3
        env = json.loads((sweep.run_dir(point) / "env.json").read_text())
        assert env["world_size"] == 1
