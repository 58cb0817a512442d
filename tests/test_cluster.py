"""Cluster scale without a cluster: SLURM's environment faked, submitit's local executor, torchrun's c10d
rendezvous on localhost, two drivers as the two nodes of one point, and the sbatch script."""
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import pytest

import conftest
from conftest import driver_env
from harness.config import compose
from harness.driver import launch
from harness.cluster import nodes, preview, stops
from harness.contract.errors import ConfigError
from harness.contract.runfiles import read_jsonl

REPO_ROOT = Path(__file__).resolve().parent.parent
FAST = ["model=tiny", "train.warmup_steps=0", "train.measure_steps=2", "train.seq_len=32", "logger=none"]
SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
harness_cmd = partial(conftest.harness_cmd, fast=FAST)
harness_run = partial(conftest.harness_run, fast=FAST)


def free_port() -> int:
    return nodes.rendezvous_port({"nnodes": 1}, nodes.NodePlace(0, 1, ("localhost",)))


# --- the SLURM environment -----------------------------------------------------------------------------

@pytest.mark.parametrize("nodelist,hosts", [
    ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
    ("gpu[098-101],login1", ["gpu098", "gpu099", "gpu100", "gpu101", "login1"]),
    ("rack[1-2]-n[8-9]", ["rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"]),
    ("node7", ["node7"]),
])
def test_nodelist_expands_like_scontrol(nodelist, hosts):
    assert nodes.expand_nodelist(nodelist) == hosts


def test_this_node_reads_the_slurm_job():
    place = nodes.this_node({"SLURM_JOB_ID": "981", "SLURM_JOB_NODELIST": "gpu[11-12]", "SLURM_JOB_NUM_NODES": "2",
                               "SLURM_NODEID": "1", "SLURM_ARRAY_JOB_ID": "975", "SLURM_ARRAY_TASK_ID": "6",
                               "SLURM_RESTART_COUNT": "2", "SLURM_JOB_END_TIME": "1700000000"})
    assert (place.node_rank, place.nnodes, place.hosts) == (1, 2, ("gpu11", "gpu12"))
    assert (place.job_id, place.requeue_id, place.attempt, place.end_time) == ("981", "975_6", 2, 1.7e9)
    assert not place.primary
    single_node_point = nodes.this_node({"SLURM_JOB_ID": "981", "SLURM_JOB_NODELIST": "gpu[11-12]",
                                           "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1"}, nnodes=1)
    assert single_node_point.primary and single_node_point.job_id == "981"  # records itself, keeps SLURM facts
    alone = nodes.this_node({})
    assert alone.primary and alone.nnodes == 1 and alone.job_id is None


def test_every_node_of_a_job_meets_on_the_first_host_with_its_ranks_fixed_by_its_node_id():
    launcher = {"nproc_per_node": 8, "nnodes": 2, "rdzv_backend": "static", "rdzv_port": None,
                "rdzv_endpoint": None, "dist_timeout_min": 10}
    commands = []
    for node_rank in (0, 1):
        place = nodes.this_node(preview.job_environment(["gpu01", "gpu02"], node_rank, "123456"))
        commands.append(nodes.torchrun_command(Path("RUN"), nodes.launcher_for_node(launcher, place)))
    assert [word for word in commands[0] if word != "--node_rank=0"] == \
        [word for word in commands[1] if word != "--node_rank=1"]  # node 1 holds ranks 8-15, whoever joins first
    assert "--rdzv_endpoint=gpu01:30956" in commands[0]  # 29500 + 123456 % 2000
    assert {"--nnodes=2", "--nproc_per_node=8", "--rdzv_backend=static", "--rdzv_id=123456",
            "--rdzv_conf=timeout=600"} <= set(commands[0])
    assert "--standalone" not in commands[0]
    pinned = nodes.launcher_for_node({**launcher, "rdzv_port": 4321}, place)
    assert pinned["rdzv_endpoint"] == "gpu01:4321"


def test_one_node_points_stay_standalone_or_take_a_free_localhost_port():
    alone = nodes.NodePlace(0, 1, ("host",))
    standalone = {"nproc_per_node": 2, "nnodes": 1, "rdzv_backend": None}
    assert "--standalone" in nodes.torchrun_command(Path("RUN"), nodes.launcher_for_node(standalone, alone))
    first, second = (nodes.launcher_for_node({**standalone, "rdzv_backend": "c10d"}, alone) for _ in range(2))
    assert first["rdzv_endpoint"].startswith("localhost:") and first["rdzv_endpoint"] != second["rdzv_endpoint"]


@pytest.mark.parametrize("launcher,place,key", [
    ({"nnodes": 2, "rdzv_backend": "static"}, nodes.NodePlace(0, 1, ("h",)), "launcher.nnodes"),
    ({"nnodes": 2, "rdzv_backend": "static"}, nodes.NodePlace(0, 3, ("a", "b", "c"), job_id="5"), "launcher.nnodes"),
    ({"nnodes": 2, "rdzv_backend": None}, nodes.NodePlace(0, 2, ("a", "b"), job_id="5"), "launcher.rdzv_backend"),
    ({"nnodes": 2, "rdzv_backend": "c10d"}, nodes.NodePlace(0, 2, ("a", "b"), job_id="5"), "launcher.rdzv_backend"),
])
def test_impossible_allocations_name_their_key(launcher, place, key):
    with pytest.raises(ConfigError) as err:
        nodes.check_allocation(launcher, place)
    assert err.value.key == key
    nodes.check_allocation({**launcher, "nnodes": place.nnodes, "rdzv_backend": "static"},
                             nodes.NodePlace(0, place.nnodes, place.hosts, job_id="5"))


# --- stops, requeue, dead peers -------------------------------------------------------------------------

def test_sigterm_is_timeout_at_the_time_limit_else_preemption_and_the_warning_is_always_timeout():
    end = 1000.0
    assert stops.stop_status(signal.SIGTERM, end, now=end + 26) == "timeout"  # SLURM enforces the limit late
    assert stops.stop_status(signal.SIGTERM, end, now=end - 5) == "timeout"  # another node's clock
    assert stops.stop_status(signal.SIGTERM, end, now=end - 100) == "preempted"
    assert stops.stop_status(signal.SIGTERM, None, now=0) == "preempted"  # no limit known
    assert stops.stop_status(signal.SIGUSR2, end, now=end - 150) == "timeout"  # submitit's time-limit warning
    assert stops.stop_status(signal.SIGUSR2, None, now=0) == "timeout"
    assert stops.stop_signals({"SUBMITIT_PREEMPT_SIGNAL": "USR1"}) == (signal.SIGTERM, signal.SIGUSR1)


def test_the_end_time_comes_from_the_environment_where_slurm_sets_it():
    place = nodes.this_node({"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "h", "SLURM_JOB_END_TIME": "1700000000"})
    assert stops.job_end_time(place) == 1.7e9
    assert stops.job_end_time(nodes.NodePlace(0, 1, ("h",))) is None  # not a SLURM job


def signal_once_handled(signum: int) -> None:
    """Send ourselves `signum` once run_workers has put its handler in place (not before: it would kill us)."""
    def send():
        while signal.getsignal(signum) is signal.SIG_DFL:
            time.sleep(0.05)
        os.kill(os.getpid(), signum)

    threading.Thread(target=send, daemon=True).start()


@pytest.mark.slow
def test_a_stop_signal_kills_the_ranks_and_names_the_status(tmp_path):
    signal_once_handled(signal.SIGUSR2)
    result = launch.run_workers(SLEEPER, dict(os.environ), tmp_path, timeout_s=60, echo=lambda line: None,
                                stop_signals=(signal.SIGTERM, signal.SIGUSR2), name_stop=lambda signum: "timeout")
    assert result.wall_time_s < 30 and result.returncode != 0
    assert launch.classify(result, tmp_path, 2, 5) == ("timeout", "SIGUSR2 after 2 of 5 steps")
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL  # handed back after the point


@pytest.mark.slow
def test_a_failed_peer_node_ends_this_node_as_died_at_once(tmp_path):
    node0 = nodes.NodePlace(0, 2, ("a", "b"), job_id="9", attempt=1)
    node1 = nodes.NodePlace(1, 2, ("a", "b"), job_id="9", attempt=1)
    watch = stops.peer_failure_watch(tmp_path, node0)
    stops.write_node_failure(tmp_path, nodes.NodePlace(1, 2, ("a", "b"), job_id="9", attempt=0), -9)
    assert watch() is None  # an earlier attempt's failure is stale
    threading.Timer(1.0, stops.write_node_failure, (tmp_path, node1, -9)).start()
    result = launch.run_workers(SLEEPER, dict(os.environ), tmp_path, timeout_s=60, echo=lambda line: None,
                                peer_failure=watch)
    assert result.wall_time_s < 30 and not result.timed_out
    status, reason = launch.classify(result, tmp_path, 1, 5)
    assert status == "died" and reason.startswith("node 1 (") and "exit code -9" in reason


def test_jobs_are_submitted_requeue_or_no_requeue_as_launcher_requeue_says():
    from harness.cluster import launcher

    site = {"submitit_folder": "F/%j", "max_num_timeout": 0, "timeout_min": 60, "partition": "gpu",
            "additional_parameters": {"mail-type": "END"}}
    kept, dropped = (launcher.executor_parameters(site, requeue) for requeue in (True, False))
    assert kept["slurm_additional_parameters"] == {"mail-type": "END", "requeue": True}
    assert dropped["slurm_additional_parameters"] == {"mail-type": "END", "no-requeue": True}
    assert (kept["timeout_min"], kept["slurm_partition"]) == (60, "gpu")  # submitit's shared and SLURM-only names
    assert "submitit_folder" not in kept and "slurm_max_num_timeout" not in kept  # the executor's own arguments


def test_a_job_is_waited_for_until_slurm_says_it_ended_and_again_once_slurm_requeues_it(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from harness.cluster import launcher

    answers = itertools.chain([{"JobState": "RUNNING"}, {"JobState": "NODE_FAIL"}, {"JobState": "PENDING"}, None,
                               {"JobState": "CANCELLED"}], itertools.repeat({}))  # None: no answer; {}: forgotten
    asked = []
    monkeypatch.setattr(launcher.stops, "slurm_job_fields", lambda job_id: asked.append(job_id) or next(answers))
    monkeypatch.setattr(launcher, "STATE_POLL_S", 0.01)
    monkeypatch.setattr(launcher, "RESULT_POLL_S", 0.01)
    monkeypatch.setattr(launcher, "RESULT_GRACE_S", 0.03)
    ran = SimpleNamespace(result_pickle=tmp_path / "result.pkl", stdout=tmp_path / "log.out")
    ran.stdout.touch()
    assert launcher.wait_for_job(ran, "7_1") == "no longer listed by SLURM"  # NODE_FAIL then requeued: not the end
    assert len(asked) >= 6
    asked.clear()
    ran.result_pickle.touch()
    assert launcher.wait_for_job(ran, "7_1") is None and not asked  # a result: SLURM is not asked


# --- configs: launchers and the untracked site config --------------------------------------------------

@pytest.fixture
def conf_copy(tmp_path, monkeypatch):
    """A copy of conf/ without any site config, composed instead of the repo's."""
    conf = tmp_path / "conf"
    shutil.copytree(REPO_ROOT / "conf", conf, ignore=shutil.ignore_patterns("local"))
    monkeypatch.setattr(compose, "CONF_DIR", conf)
    return conf


def test_slurm_launcher_composes_without_and_with_a_site_config(conf_copy):
    cfg = compose.compose_point(["launcher=slurm", "launcher.nnodes=2"], with_hydra=True)
    assert cfg.hydra.launcher._target_ == "hydra_plugins.harness_launcher.SlurmLauncher"
    assert cfg.hydra.launcher.partition is None
    assert (cfg.hydra.launcher.nodes, cfg.hydra.launcher.gpus_per_node, cfg.hydra.launcher.tasks_per_node) == (2, 8, 1)
    (conf_copy / "local").mkdir()
    (conf_copy / "local" / "default.yaml").write_text(
        "# @package _global_\nhydra:\n  launcher:\n    partition: h200\n    account: lab\n"
        "    setup: ['source .venv/bin/activate']\nlauncher:\n  gpu_memory_gb: 141\n")
    site = compose.compose_point(["launcher=slurm"], with_hydra=True)
    assert (site.hydra.launcher.partition, site.hydra.launcher.account) == ("h200", "lab")
    assert list(site.hydra.launcher.setup) == ["source .venv/bin/activate"] and site.launcher.gpu_memory_gb == 141
    override = compose.compose_point(["launcher=slurm", "hydra.launcher.partition=debug"], with_hydra=True)
    assert override.hydra.launcher.partition == "debug"  # the command line beats the site config
    local = compose.compose_point(["launcher=submitit_local"], with_hydra=True)
    assert local.hydra.launcher._target_.endswith("LocalLauncher") and local.launcher.nproc_per_node == 1


def readme_job_example() -> tuple[list[str], str]:
    """harness/cluster/README.md's `python -m harness.cluster ...` command and the output shown under it."""
    section = (REPO_ROOT / "harness" / "cluster" / "README.md").read_text()
    command = re.search(r"^python -m harness\.cluster (.+)$", section, re.M).group(1)
    shown = re.search(r"```text\n(# sbatch script.*?)```", section, re.S).group(1)
    return shlex.split(command), shown


def test_readme_shows_the_generated_two_node_job(conf_copy, monkeypatch):
    for name in ("PYTHONUNBUFFERED", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "DEEPSPEED_TIMEOUT",
                 "PYTORCH_CUDA_ALLOC_CONF", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    args, shown = readme_job_example()
    overrides = [a for a in args if "=" in a and not a.startswith("--")]
    generated = preview.format_job(overrides, "-m" in args, "gpu[01-02]", "123456")
    timestamp = re.compile(r"\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}")
    assert timestamp.sub("TIME", generated).strip() == timestamp.sub("TIME", shown).strip()
    script, node_part = generated.split("\n\n# the driver of point 0")
    for flag in ("--nodes=2", "--gpus-per-node=8", "--ntasks-per-node=1", "--signal=USR2@120", "--time=90",
                 "--partition=gpu", "--account=my_account", "--cpus-per-task=96", "--mem=512GB", "--no-requeue"):
        assert f"#SBATCH {flag}\n" in script
    assert "\n# setup\nsource .venv/bin/activate\n" in script
    assert re.search(r"^srun .* python -u -m submitit\.core\._submit multirun/pr8186_table/", script, re.M)
    node_lines = [line for line in node_part.splitlines() if line.startswith("PYTHONUNBUFFERED")]
    assert len(node_lines) == 2  # both nodes join the same rendezvous, each with its own node rank
    assert node_lines[0].replace("--node_rank=0", "--node_rank=1") == node_lines[1]
    words = shlex.split(node_lines[0])
    assert {"TORCH_NCCL_ASYNC_ERROR_HANDLING=1", "DEEPSPEED_TIMEOUT=10",
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"} <= set(words)
    assert {"--nnodes=2", "--nproc_per_node=8", "--rdzv_backend=static", "--rdzv_endpoint=gpu01:30956"} <= set(words)
    assert words[-3:] == ["-m", "harness.rank.worker", "RUN_DIR"] and "worker.node1.log" in node_part


# --- end to end on this machine ------------------------------------------------------------------------

def run_dir_files(sweep: Path, run_dir: str) -> set[str]:
    return {str(p.relative_to(sweep / run_dir)) for p in (sweep / run_dir).rglob("*")}


@pytest.mark.slow
def test_submitit_local_sweep_writes_the_same_files_and_index_as_the_basic_launcher(tmp_path):
    sweeps = {}
    for launcher in ("local", "submitit_local"):  # side by side: much of a point is waiting
        (tmp_path / launcher).mkdir()
        sweeps[launcher] = subprocess.Popen(
            harness_cmd(tmp_path / launcher, f"launcher={launcher}", "train.micro_batch=1,2", multirun=True),
            cwd=tmp_path / launcher, env=driver_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    index = {}
    for launcher, sweep in sweeps.items():
        output = sweep.communicate(timeout=600)[0]
        assert sweep.returncode == 0, output[-3000:]
        index[launcher] = read_jsonl(tmp_path / launcher / "sweep" / "index.jsonl")
    basic, submitit = index["local"], index["submitit_local"]
    assert [line["status"] for line in submitit] == ["ok", "ok"] == [line["status"] for line in basic]
    assert [line["run_dir"] for line in submitit] == [line["run_dir"] for line in basic]
    for a, b in zip(basic, submitit):
        assert set(a) == set(b) and set(a["final"]) == set(b["final"])
        assert all(value is not None for value in (b["final"]["step_time_s_median"], b["final"]["tokens_per_s_median"]))
        assert [o for o in a["overrides"] if not o.startswith("launcher=")] == \
            [o for o in b["overrides"] if not o.startswith("launcher=")]
        assert run_dir_files(tmp_path / "local" / "sweep", a["run_dir"]) == \
            run_dir_files(tmp_path / "submitit_local" / "sweep", b["run_dir"])
        rows = read_jsonl(tmp_path / "submitit_local" / "sweep" / b["run_dir"] / "steps.jsonl")
        assert len(rows) == 3
    assert (tmp_path / "submitit_local" / "sweep" / ".submitit").is_dir()


@pytest.mark.slow
def test_c10d_two_rank_point_records_rank_metrics_and_a_killed_rank_dies_fast(tmp_path):
    # A rank killed at step 1 must end the point as died at once: had its peer waited for the 2-minute
    # process-group timeout instead, the 60 s stall timeout (counted from step 0, so start-up on a slow machine
    # does not count) would have ended it first, as timeout.
    proc = harness_run(tmp_path, "launcher=submitit_local", "launcher.rdzv_backend=c10d", "launcher.nproc_per_node=2",
                       "launcher.dist_timeout_min=2", "launcher.stall_timeout_s=60", "debug.fault=slow,kill",
                       "debug.fault_rank=1", "debug.fault_step=1", "debug.fault_sleep_s=5.0", multirun=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ok, killed = read_jsonl(tmp_path / "sweep" / "index.jsonl")
    assert (ok["status"], killed["status"]) == ("ok", "died")  # the sweep goes on past the dead rank
    sweep = tmp_path / "sweep"
    command = (sweep / ok["run_dir"] / "worker.log").read_text().splitlines()[0]
    assert "--rdzv_backend=c10d --rdzv_endpoint=localhost:" in command and "--standalone" not in command
    summary = json.loads((sweep / ok["run_dir"] / "summary.json").read_text())
    facts = json.loads((sweep / ok["run_dir"] / "worker.json").read_text())
    assert summary["world_size"] == facts["world_size"] == 2
    rows = read_jsonl(sweep / ok["run_dir"] / "steps.jsonl")
    assert len(rows) == 3 and all(r["tokens"] == 2 * 2 * 32 for r in rows)  # both ranks' tokens in every step
    assert all(r["tokens_per_s"] == pytest.approx(r["tokens"] / r["step_time_s"]) for r in rows)
    # Only rank 1 slept 5 s inside step 1 (after the step's collectives, so rank 0 did not wait for it): this is
    # the max over ranks. The sleep is long against a tiny step, so the other steps stay under it on a loaded
    # machine too.
    assert rows[1]["step_time_s"] >= 5.0 > max(rows[0]["step_time_s"], rows[2]["step_time_s"])
    died = json.loads((sweep / killed["run_dir"] / "summary.json").read_text())
    assert died["steps_completed"] == 1 == len(read_jsonl(sweep / killed["run_dir"] / "steps.jsonl"))
    assert died["reason"].startswith("rank ")


@pytest.mark.slow
def test_two_drivers_are_the_two_nodes_of_one_point_and_only_node_0_records_it(tmp_path):
    port = str(free_port())
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "localhost,localhost", "SLURM_JOB_NUM_NODES": "2"}
    cmd = harness_cmd(tmp_path, "launcher=slurm", "launcher.nnodes=2", "launcher.nproc_per_node=1",
                      f"launcher.rdzv_port={port}", "launcher.dist_timeout_min=2", "logger=wandb")
    drivers = [subprocess.Popen(cmd, cwd=tmp_path, env=driver_env(**slurm, SLURM_NODEID=str(k)), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for k in (0, 1)]
    outputs = [driver.communicate(timeout=400)[0] for driver in drivers]
    assert [driver.returncode for driver in drivers] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    run_dir = tmp_path / "run"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["world_size"] == 2, summary
    env = json.loads((run_dir / "env.json").read_text())
    assert env["world_size"] == 2 and env["hostnames"]
    rows = read_jsonl(run_dir / "steps.jsonl")
    assert len(rows) == 3 and all(r["tokens"] == 2 * 2 * 32 for r in rows)  # rank 0 alone wrote them
    assert "status: ok" in outputs[0] and "status:" not in outputs[1]  # node 1 only ran its rank
    assert len(list((run_dir / "wandb").glob("offline-run-*"))) == 1  # one W&B run, from node 0
    assert (run_dir / "worker.log").exists() and (run_dir / "worker.node1.log").exists()
    assert not list(run_dir.glob("node*.failed.json"))


@pytest.mark.slow
def test_slurm_time_limit_warning_records_timeout_with_the_steps_done(tmp_path):
    slurm = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_NUM_NODES": "1",
             "SLURM_NODEID": "0", "SLURM_JOB_END_TIME": str(int(time.time()) + 150)}
    driver = subprocess.Popen(harness_cmd(tmp_path, "train.measure_steps=4", "debug.fault=hang", "debug.fault_step=2"),
                              cwd=tmp_path, env=driver_env(**slurm), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    steps = tmp_path / "run" / "steps.jsonl"
    while len(read_jsonl(steps)) < 2 and driver.poll() is None:  # however long start-up takes
        time.sleep(0.5)
    driver.send_signal(signal.SIGUSR2)  # what SLURM sends signal_delay_s before the time limit
    output = driver.communicate(timeout=120)[0]
    assert driver.returncode == 1, output[-3000:]  # not ok; SLURM's own stop leaves the exit code alone
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "timeout" and summary["reason"] == "SIGUSR2 after 2 of 5 steps"
    assert summary["steps_completed"] == 2 == len(read_jsonl(steps))
