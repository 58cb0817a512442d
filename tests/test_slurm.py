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
from harness.contract.runfiles import read_jsonl
from slurm_cluster import Cluster, ClusterUnavailable

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

FAST = ["model=tiny", "train.seq_len=32", "logger=none", "launcher=slurm", "launcher.nproc_per_node=1"]
harness_cmd = partial(conftest.harness_cmd, fast=FAST, multirun=True)


@pytest.fixture(scope="session")
def slurm_cluster():
    """One cluster for the session, stopped at its end whatever the outcome (every daemon by its pid)."""
    root = Path(tempfile.mkdtemp(prefix="slurm-"))  # not under pytest's private tmp: munged's socket must be reachable
    cluster = Cluster(root)
    try:
        cluster.start()
    except ClusterUnavailable as error:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"slurm: {error}")
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def cluster(slurm_cluster):
    """The session's cluster, with no job of this test left in it afterwards (a failed test's hung job would hold
    the nodes the next test needs)."""
    yield slurm_cluster
    slurm_cluster.cancel_all_jobs()


def total_steps(count: int) -> list[str]:
    """Overrides that set a point's total steps (the measurement protocol's measured count then follows)."""
    return [f"train.steps={count}", "train.measure_steps=null"]


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

    def job(self, point: int, timeout: float = 60) -> str:
        """The SLURM job of a point (ARRAY_TASK in a sweep of several), from submitit's folder."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            jobs = [p.name[:-len("_submitted.pkl")] for p in self.dir.glob(".submitit/*/*_submitted.pkl")]
            mine = [job for job in jobs if job.partition("_")[2] == str(point) or (point == 0 and "_" not in job)]
            if mine:
                return mine[0]
            time.sleep(0.5)
        pytest.fail(f"no SLURM job for point {point} within {timeout:.0f} s")

    def job_field(self, point: int, field: str) -> str:
        """A field of `scontrol show job` (the controller keeps an ended job for MinJobAge, 300 s)."""
        out = self.cluster.slurm(["scontrol", "show", "job", "-o", self.job(point)]).stdout
        return next(word.split("=", 1)[1] for word in out.split() if word.startswith(f"{field}="))

    def wait_for_steps(self, point: int, count: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            run_dirs = list(self.dir.glob(f"{point}_*"))
            if run_dirs and len(read_jsonl(run_dirs[0] / "steps.jsonl")) >= count:
                return
            time.sleep(0.5)
        pytest.fail(f"point {point} wrote no {count} steps within {timeout:.0f} s:\n{self.finish(10)[-3000:]}")


def test_a_two_point_sweep_runs_both_points_and_writes_its_index(cluster, tmp_path):
    sweep = Sweep(cluster, tmp_path, *total_steps(3), "train.micro_batch=1,2")
    output = sweep.finish()
    assert sweep.proc.returncode == 0, output[-3000:]
    assert [line["status"] for line in sweep.index()] == ["ok", "ok"]
    for point in (0, 1):
        assert len(sweep.steps(point)) == 3
        env = json.loads((sweep.run_dir(point) / "env.json").read_text())
        assert env["world_size"] == 1


# --- time limits -------------------------------------------------------------------------------------------

def test_the_time_limit_is_timeout_with_the_steps_kept_whether_or_not_its_warning_comes(cluster, tmp_path):
    # Two points at a 1-minute limit, both hung at step 2. SLURM sends the first its warning (USR2, asked for
    # signal_delay_s before the limit; SLURM's 30 s check sends it up to 30 s earlier); the second asks for none,
    # so SLURM's SIGTERM at the limit (enforced up to 30 s late) is all it gets. With launcher.requeue=true a
    # point at its limit must not go back to the queue (it would only reach the limit again).
    hung = [*total_steps(5), "debug.fault=hang", "debug.fault_step=2", "hydra.launcher.timeout_min=1",
            "launcher.requeue=true"]
    (tmp_path / "warned").mkdir()
    (tmp_path / "unwarned").mkdir()
    warned = Sweep(cluster, tmp_path / "warned", *hung, "hydra.launcher.signal_delay_s=1")
    unwarned = Sweep(cluster, tmp_path / "unwarned", *hung, "hydra.launcher.signal_delay_s=0")
    for sweep, signal_name in ((warned, "SIGUSR2"), (unwarned, "SIGTERM")):
        output = sweep.finish(timeout=240)
        assert sweep.proc.returncode == 0, output[-3000:]
        summary = sweep.summary(0)
        assert (summary["status"], summary["reason"]) == ("timeout", f"{signal_name} after 2 of 5 steps"), output[-3000:]
        assert summary["steps_completed"] == 2 == len(sweep.steps(0))
        assert [line["status"] for line in sweep.index()] == ["timeout"]
        assert not (sweep.run_dir(0) / "attempts").exists()
        assert sweep.job_field(0, "Restarts") == "0"  # never requeued


# --- preemption and requeue ----------------------------------------------------------------------------------

def test_preemption_with_requeue_runs_the_point_again_until_it_finishes(cluster, tmp_path):
    # Stopped twice while its step 2 sleeps: by `scancel --signal=TERM` (the harness requeues the job) and by
    # `scontrol requeue` (SLURM requeues it and signals it). Each stopped attempt is recorded `preempted` with its
    # steps and set aside in attempts/N/; the third attempt finishes, and only then does the sweep write its index.
    sweep = Sweep(cluster, tmp_path, *total_steps(4), "debug.fault=slow", "debug.fault_step=2",
                  "debug.fault_sleep_s=15", "launcher.requeue=true")
    for attempt, stop in enumerate((["scancel", "--signal=TERM"], ["scontrol", "requeue"])):
        sweep.wait_for_steps(0, 2)
        assert sweep.job_field(0, "Restarts") == str(attempt)
        assert cluster.slurm([*stop, sweep.job(0)]).returncode == 0
        while not (sweep.run_dir(0) / "attempts" / str(attempt)).exists() and sweep.proc.poll() is None:
            time.sleep(0.5)  # the next attempt has started
    output = sweep.finish()
    assert sweep.proc.returncode == 0, output[-3000:]
    assert [line["status"] for line in sweep.index()] == ["ok"]
    assert sweep.summary(0)["status"] == "ok" and len(sweep.steps(0)) == 4
    for attempt, signal_name in enumerate(("SIGTERM", "SIGTERM")):
        earlier = sweep.run_dir(0) / "attempts" / str(attempt)
        summary = json.loads((earlier / "summary.json").read_text())
        assert (summary["status"], summary["reason"]) == ("preempted", f"{signal_name} after 2 of 4 steps")
        assert len(read_jsonl(earlier / "steps.jsonl")) == 2
    assert sorted(p.name for p in (sweep.run_dir(0) / "attempts").iterdir()) == ["0", "1"]
    assert sweep.job_field(0, "Restarts") == "2"


def test_without_requeue_a_preempted_point_stays_recorded_and_slurm_refuses_to_requeue_it(cluster, tmp_path):
    # SLURM requeues a batch job by default (scontrol requeue, a node failure, preemption in REQUEUE mode): with
    # launcher.requeue=false the job must be submitted --no-requeue, or a point already in the index runs again.
    sweep = Sweep(cluster, tmp_path, *total_steps(4), "debug.fault=hang", "debug.fault_step=2")
    sweep.wait_for_steps(0, 2)
    assert cluster.slurm(["scancel", "--signal=TERM", sweep.job(0)]).returncode == 0
    output = sweep.finish()
    assert sweep.proc.returncode == 0, output[-3000:]
    assert [line["status"] for line in sweep.index()] == ["preempted"]
    refused = cluster.slurm(["scontrol", "requeue", sweep.job(0)])
    assert refused.returncode != 0 and "disabled" in refused.stderr
    summary = sweep.summary(0)
    assert (summary["status"], summary["reason"]) == ("preempted", "SIGTERM after 2 of 4 steps")
    assert len(sweep.steps(0)) == 2 and not (sweep.run_dir(0) / "attempts").exists()
    assert sweep.job_field(0, "Restarts") == "0"


# --- jobs that end without a result --------------------------------------------------------------------------

def wait_until_pending(sweep: Sweep, points: int) -> list[str]:
    jobs = [sweep.job(point) for point in range(points)]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if all(sweep.job_field(point, "JobState") == "PENDING" for point in range(points)):
            return jobs
        time.sleep(0.5)
    pytest.fail("the held jobs are not pending")


def test_a_job_cancelled_while_pending_is_recorded_and_the_sweep_writes_its_index(cluster, tmp_path):
    # sacct reports the job CANCELLED; submitit then finds no result and hydra-submitit-launcher raised
    # UncompletedJobError: exit 1 and no index.
    sweep = Sweep(cluster, tmp_path, *total_steps(3), "++hydra.launcher.additional_parameters.hold=true")
    (cancelled,) = wait_until_pending(sweep, 1)
    assert cluster.slurm(["scancel", cancelled]).returncode == 0
    output = sweep.finish(timeout=120)
    assert sweep.proc.returncode == 0, output[-3000:]
    assert [line["status"] for line in sweep.index()] == ["preempted"]
    summary = sweep.summary(0)
    assert summary["reason"] == f"SLURM job {cancelled} ended without a result (CANCELLED)"
    assert summary["steps_completed"] == 0 and "train.steps=3" in sweep.index()[0]["overrides"]


def test_without_accounting_the_sweep_goes_on_past_a_job_that_never_ran(cluster, tmp_path):
    # With sacct failing (slurmdbd down, or no accounting at all), submitit sees every job as UNKNOWN and waited
    # for ever for the one cancelled while pending; an array task cancelled while pending leaves no record at all.
    cluster.stop_accounting()
    try:
        sweep = Sweep(cluster, tmp_path, *total_steps(3), "train.micro_batch=1,2",
                      "++hydra.launcher.additional_parameters.hold=true")
        ran, cancelled = wait_until_pending(sweep, 2)
        assert cluster.slurm(["sacct", "-j", ran]).returncode != 0  # no accounting
        assert cluster.slurm(["scancel", cancelled]).returncode == 0
        assert cluster.slurm(["scontrol", "release", ran]).returncode == 0
        output = sweep.finish(timeout=180)
    finally:
        cluster.start_accounting()
    assert sweep.proc.returncode == 0, output[-3000:]
    assert [line["status"] for line in sweep.index()] == ["ok", "preempted"]
    assert sweep.summary(1)["reason"] == f"SLURM job {cancelled} ended without a result (no longer listed by SLURM)"
    assert "train.micro_batch=2" in sweep.index()[1]["overrides"]


# --- two nodes -----------------------------------------------------------------------------------------------

def test_two_node_points_pin_rank_0_to_node_0_and_name_the_rank_that_died(cluster, tmp_path):
    # Each point is one job on both slurmd nodes (hnode1, hnode2): a driver per node, one torchrun each, joined
    # by the rendezvous the harness derives from SLURM_* variables. Global rank 0 must sit on SLURM node 0, and
    # a rank killed on either node must be named as the cause, not the other rank's "connection reset".
    sweep = Sweep(cluster, tmp_path, "launcher.nnodes=2", *total_steps(3), "launcher.dist_timeout_min=2",
                  "debug.fault=null,kill", "debug.fault_step=1", "debug.fault_rank=0,1")
    output = sweep.finish()
    assert sweep.proc.returncode == 0, output[-3000:]
    assert [line["status"] for line in sweep.index()] == ["ok", "ok", "died", "died"]
    for point in (0, 1):
        run_dir = sweep.run_dir(point)
        facts = json.loads((run_dir / "worker.json").read_text())
        assert facts["world_size"] == 2 == sweep.summary(point)["world_size"]
        assert [row["tokens"] for row in sweep.steps(point)] == [2 * 2 * 32] * 3  # both ranks' tokens
        assert "step 2/3" in (run_dir / "worker.log").read_text()  # rank 0's progress, on node 0
        assert "step 2/3" not in (run_dir / "worker.node1.log").read_text()
    killed_on_node_0, killed_on_node_1 = sweep.summary(2), sweep.summary(3)
    assert killed_on_node_0["reason"].startswith("rank 0: killed by SIGKILL on node 0 (")
    assert killed_on_node_1["reason"].startswith("rank 1: killed by SIGKILL on node 1 (")
    assert killed_on_node_0["steps_completed"] == killed_on_node_1["steps_completed"] == 1
    assert "SIGKILL" in (sweep.run_dir(2) / "worker.log").read_text()  # torchrun of node 0 saw its rank 0 die
    assert (sweep.run_dir(3) / "node1.failed.json").exists()
    # the failed node stopped the other at once, far inside the 2-minute process-group timeout
    assert max(killed_on_node_0["wall_time_s"], killed_on_node_1["wall_time_s"]) < 60
