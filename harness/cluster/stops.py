"""How a point is stopped from outside its ranks: SLURM's stop signals (its time limit, a preemption) and the
status each is recorded as, a requeue, and a failed node stopping the point's other nodes at once.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Mapping

from harness import launch, runfiles
from harness.cluster.nodes import NodePlace
from harness.launch import LaunchResult

# A stop signal this close to the job's end time is SLURM's time-limit warning (submitit asks for it
# signal_delay_s = 120 s ahead; SLURM may send it up to 60 s early).
TIME_LIMIT_WINDOW_S = 300
# How long the node that records a failed multi-node point waits for the other nodes to report why they failed.
PEER_REPORT_WAIT_S = 10


# --- SLURM stops: time limit, preemption, requeue ----------------------------------------------------

def stop_signals(environ: Mapping[str, str] = os.environ) -> tuple[signal.Signals, ...]:
    """SIGTERM (preemption, scancel, the time limit itself) and submitit's warning signal (USR2 unless
    SUBMITIT_PREEMPT_SIGNAL names another), which SLURM sends ahead of the time limit and on preemption."""
    warning = getattr(signal, "SIG" + environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))
    return (signal.SIGTERM, warning)


def stop_status(signum: int, place: NodePlace, now: float) -> str:
    """`timeout` when the job is at its time limit, else `preempted`. Without the job's end time, the
    warning signal means the time limit (submitit's --signal) and SIGTERM means preemption."""
    if place.end_time is not None:
        return "timeout" if place.end_time - now <= TIME_LIMIT_WINDOW_S else "preempted"
    return "preempted" if signum == signal.SIGTERM else "timeout"


def requeue_job(place: NodePlace) -> bool:
    """Put this SLURM job back in the queue (its point then runs again from step 0); True if SLURM took it."""
    if place.requeue_id is None or not shutil.which("scontrol"):
        return False
    out = subprocess.run(["scontrol", "requeue", place.requeue_id], capture_output=True, text=True, timeout=60)
    print(f"scontrol requeue {place.requeue_id}: " + (out.stderr.strip() or "ok"), file=sys.stderr)
    return out.returncode == 0


# --- node failures: a failed node stops the others at once -------------------------------------------

def node_failure_path(run_dir: Path, node_rank: int) -> Path:
    return Path(run_dir) / runfiles.node_failure(node_rank)


def report_failure(result: LaunchResult, run_dir: Path, place: NodePlace, log_name: str,
                   peers: Callable[[], str | None] | None) -> None:
    """What this node's failed launch leaves for the point's record: an error file for each of its ranks a
    signal killed; on a multi-node point, its failure (the other nodes stop at once) and, on node 0, the failure
    another node reports (in `result.peer_failure`) when no rank of node 0 was killed: the cause may be there."""
    if result.returncode == 0 or result.stopped_as or result.timed_out:
        return
    died = not result.stalled  # else the harness stopped the ranks
    if died:
        launch.record_killed_ranks(run_dir, log_name, f"node {place.node_rank} ({socket.gethostname()})")
    if peers is None or result.peer_failure:
        return
    write_node_failure(run_dir, place, result.returncode)
    if died and place.primary and not launch.killed_ranks(run_dir / log_name):
        result.peer_failure = await_peer_failure(peers)


def await_peer_failure(watch: Callable[[], str | None], seconds: float = PEER_REPORT_WAIT_S) -> str | None:
    """After this node's own ranks failed: the first failure another node reports within `seconds`, or None.
    Their ranks fail too once ours do; a rank of theirs that a signal killed may be the cause of it all."""
    deadline = time.monotonic() + seconds
    while (failure := watch()) is None and time.monotonic() < deadline:
        time.sleep(0.5)
    return failure


def write_node_failure(run_dir: Path, place: NodePlace, returncode: int | None) -> None:
    """Tell the point's other nodes that this node's torchrun failed (the run dir is on a shared disk)."""
    runfiles.write_json(node_failure_path(run_dir, place.node_rank),
                        {"node": place.node_rank, "host": socket.gethostname(), "returncode": returncode,
                         "attempt": place.attempt})


def peer_failure_watch(run_dir: Path, place: NodePlace) -> Callable[[], str | None]:
    """A poll for the launch loop: why another node of this attempt failed, or None. Without it the ranks
    of a dead node's peers wait in their collective until the process-group timeout."""
    peers = [node_failure_path(run_dir, k) for k in range(place.nnodes) if k != place.node_rank]

    def failed_peer() -> str | None:
        for path in peers:
            try:
                failure = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if failure["attempt"] == place.attempt:  # an earlier attempt's file is stale
                return f"node {failure['node']} ({failure['host']}) failed: torchrun exit code {failure['returncode']}"
        return None

    return failed_peer
