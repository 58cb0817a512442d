"""The launch loop on stand-in processes: Ctrl-C and SIGHUP stop every process of a point (also those in a
session of their own, as torchrun starts the ranks), a second signal kills at once, a driver failure leaves
nothing behind, and a point that stops writing steps ends as a timeout naming its last step."""
import json
import os
import signal
import sys
import threading
import time

import psutil
import pytest

from harness.driver import launch
from harness.driver.progress import StallWatch

# torchrun's stand-in: starts a "rank" in a session of its own that ignores SIGTERM, writes its pid, waits
RANK = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
TORCHRUN = ("import subprocess, sys, time\n"
            f"rank = subprocess.Popen([sys.executable, '-c', {RANK!r}], start_new_session=True)\n"
            "open(sys.argv[1], 'w').write(str(rank.pid))\n"
            "time.sleep(300)\n")


def torchrun_stand_in(tmp_path):
    return [sys.executable, "-c", TORCHRUN, str(tmp_path / "rank.pid")]


def rank_pid(tmp_path) -> int:
    path = tmp_path / "rank.pid"
    while not path.exists() or not path.read_text():
        time.sleep(0.05)
    return int(path.read_text())


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def send_when_running(tmp_path, *signums: int) -> None:
    """Once the stand-in's rank runs, send ourselves each signal in turn (run_workers handles them)."""
    def send():
        rank_pid(tmp_path)
        for signum in signums:
            os.kill(os.getpid(), signum)
            time.sleep(0.5)

    threading.Thread(target=send, daemon=True).start()


def run(tmp_path, **kwargs) -> launch.LaunchResult:
    return launch.run_workers(torchrun_stand_in(tmp_path), dict(os.environ), tmp_path, timeout_s=250,
                              echo=lambda line: None, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_ctrl_c_or_hangup_stops_every_process_of_the_point_and_names_it_interrupted(tmp_path, monkeypatch, signum):
    monkeypatch.setattr(launch, "_KILL_GRACE_S", 1.0)  # the rank ignores SIGTERM: it needs the SIGKILL after it
    before = signal.getsignal(signum)
    send_when_running(tmp_path, signum)
    result = run(tmp_path)
    assert gone(rank_pid(tmp_path))  # in a session of its own, and past torchrun's death
    assert result.stopped_as == "interrupted" and not result.timed_out
    name = signal.Signals(signum).name
    assert launch.classify(result, tmp_path, 2, 5) == ("interrupted", f"{name} after 2 of 5 steps")
    assert signal.getsignal(signum) is before  # handed back after the point


@pytest.mark.slow
def test_a_second_ctrl_c_kills_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "_KILL_GRACE_S", 200.0)  # the grace the second Ctrl-C cuts short
    send_when_running(tmp_path, signal.SIGINT, signal.SIGINT)
    result = run(tmp_path)
    assert result.stopped_as == "interrupted" and gone(rank_pid(tmp_path))
    assert result.wall_time_s < 100  # not the 200 s the rank's ignored SIGTERM would have cost


@pytest.mark.slow
def test_a_failure_in_the_driver_leaves_no_process_of_the_point_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "_KILL_GRACE_S", 1.0)

    def broken_watch():
        rank_pid(tmp_path)
        raise RuntimeError("the driver failed while the ranks ran")

    with pytest.raises(RuntimeError):
        run(tmp_path, peer_failure=broken_watch)
    assert gone(rank_pid(tmp_path))


def test_a_point_that_stops_writing_steps_ends_as_a_timeout_naming_its_last_step(tmp_path):
    clock = [0.0]
    watch = StallWatch(tmp_path, stall_timeout_s=30, steps_wanted=6, clock=lambda: clock[0])
    clock[0] = 500.0
    assert watch() is None  # model build and first compile: no step yet, not charged to the stall timeout
    (tmp_path / "worker.json").write_text(json.dumps({"phase_starts": [0, 3]}))
    steps = tmp_path / "steps.jsonl"
    for step in range(3):
        with open(steps, "a") as f:
            f.write(json.dumps({"step": step}) + "\n")
        assert watch() is None
        clock[0] += 29
        assert watch() is None
    clock[0] += 400
    assert watch() is None  # step 3 begins a phase: it compiles, charged to timeout_s only
    with open(steps, "a") as f:
        f.write(json.dumps({"step": 3}) + "\n")
    assert watch() is None
    clock[0] += 30
    assert watch() == "no new step for 30 s after step 3 (4 of 6 steps)"
    result = launch.LaunchResult(None, False, 600.0, stalled=watch())
    assert launch.classify(result, tmp_path, 4, 6) == ("timeout", "no new step for 30 s after step 3 (4 of 6 steps)")


@pytest.mark.slow
def test_the_launch_loop_ends_a_stalled_point(tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "_KILL_GRACE_S", 1.0)
    calls = []

    def stall():
        calls.append(1)
        return "no new step for 30 s after step 1 (2 of 4 steps)" if rank_pid(tmp_path) and len(calls) > 1 else None

    result = run(tmp_path, stall=stall)
    assert result.stalled and not result.timed_out and gone(rank_pid(tmp_path))
    assert launch.classify(result, tmp_path, 2, 4)[0] == "timeout"


# torchrun's report of a failed node, as it ends its log: rank 2 killed by SIGKILL (its cause), rank 3 stopped by
# torchrun with SIGTERM afterwards.
TORCHRUN_REPORT = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
harness.rank.worker FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-04_13:39:22
  host      : gpu02
  rank      : 3 (local_rank: 1)
  exitcode  : -15 (pid: 31849)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 31849
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-04_13:39:22
  host      : gpu02
  rank      : 2 (local_rank: 0)
  exitcode  : -9 (pid: 31848)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 31848
============================================================
"""


def test_a_rank_killed_by_a_signal_is_named_as_the_cause_before_the_other_ranks_errors(tmp_path):
    (tmp_path / "worker.node1.log").write_text("step 1/4 phase 0\n" + TORCHRUN_REPORT)
    assert launch.killed_ranks(tmp_path / "worker.node1.log") == {2: "SIGKILL"}  # SIGTERM is a stop, not a cause
    (tmp_path / "error.rank0.json").write_text(json.dumps(
        {"kind": "error", "rank": 0, "message": "RuntimeError: Connection reset by peer"}))  # what followed
    launch.record_killed_ranks(tmp_path, "worker.node1.log", "node 1 (gpu02)")
    assert sorted(p.name for p in tmp_path.glob("error.rank*.json")) == ["error.rank0.json", "error.rank2.json"]
    result = launch.LaunchResult(returncode=1, timed_out=False, wall_time_s=5.0, peer_failure="node 1 failed")
    assert launch.classify(result, tmp_path, 1, 4) == ("died", "rank 2: killed by SIGKILL on node 1 (gpu02)")
