"""How a point is stopped from outside its ranks: SLURM's stop signals (its time limit, a preemption) and the
status each is recorded as, a requeue, a SIGTERM outside SLURM ending the sweep, and a failed node stopping the
point's other nodes at once.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Mapping

from harness.contract import runfiles
from harness.cluster.nodes import NodePlace

logger = logging.getLogger(__name__)

# SLURM enforces the time limit at or after the job's end time (its check runs every 30 s or so); a SIGTERM this
# close before it is still the limit's (the controller's clock and this node's may differ a little).
TIME_LIMIT_SLACK_S = 10
# How long the node that records a failed multi-node point waits for the other nodes to report why they failed.
PEER_REPORT_WAIT_S = 10


# --- SLURM stops: time limit, preemption, requeue ----------------------------------------------------

def stop_signals(environ: Mapping[str, str] = os.environ) -> tuple[signal.Signals, ...]:
    """SIGTERM (preemption, scancel, the time limit itself) and submitit's warning signal (USR2 unless
    SUBMITIT_PREEMPT_SIGNAL names another), which SLURM sends ahead of the time limit (sbatch --signal)."""
    warning = getattr(signal, "SIG" + environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))
    return (signal.SIGTERM, warning)


def stop_status(signum: int, end_time: float | None, now: float) -> str:
    """The warning signal (submitit's --signal, sent only ahead of the time limit) is `timeout`. SIGTERM is
    SLURM's at the time limit (`timeout`) when the job has reached its end time, else a preemption or scancel
    (`preempted`); without the end time, a preemption."""
    if signum != signal.SIGTERM:
        return "timeout"
    return "timeout" if end_time is not None and now >= end_time - TIME_LIMIT_SLACK_S else "preempted"


def job_end_time(place: NodePlace) -> float | None:
    """When SLURM ends this job at its time limit (epoch s): SLURM_JOB_END_TIME where SLURM sets it (22.05 does
    not), else the EndTime of `scontrol show job`; None outside SLURM, without a limit or without SLURM's tools."""
    if place.end_time is not None or place.job_id is None:
        return place.end_time
    end = (slurm_job_fields(place.job_id) or {}).get("EndTime", "")
    try:
        return time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M:%S"))  # SLURM prints local time
    except ValueError:  # Unknown, None: no time limit
        return None


def slurm_job_fields(job_id: str) -> dict[str, str] | None:
    """`scontrol show job`'s fields of one job: {} once SLURM no longer knows it (it forgets an ended job after
    MinJobAge), None where SLURM cannot be asked (no tools, no answer)."""
    if not shutil.which("scontrol"):
        return None
    try:
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:  # an array task cancelled while pending is "not found": it leaves no record at all
        return {} if "Invalid job id" in out.stderr or "not found" in out.stdout else None
    return dict(re.findall(r"(\w+)=(\S*)", out.stdout))


# The job states in which a stopped point's job may go back to the queue: SLURM only signalled it (`scancel
# --signal`, a preemption's grace time) or preempted it. Not CANCELLED or COMPLETING: a plain `scancel` (which
# `scontrol requeue` would undo) or the time limit.
REQUEUE_STATES = ("RUNNING", "PREEMPTED")


def requeue_preempted(place: NodePlace, wanted: bool) -> bool:
    """After a preemption: True when the job goes back to the queue, because SLURM is requeueing it itself
    (`scontrol requeue`, preemption in REQUEUE mode: its restart count is past this attempt's) or because
    `launcher.requeue` asks for it and SLURM took it. The driver then ends without a result, so that submitit
    waits for the job's next attempt instead of taking this one's."""
    fields = slurm_job_fields(place.job_id) if place.job_id else None
    if not fields:
        return False
    restarts = fields.get("Restarts", "0")
    if restarts.isdigit() and int(restarts) > place.attempt:
        return True
    return wanted and fields.get("JobState") in REQUEUE_STATES and requeue_job(place)


class Terminated(BaseException):
    """SIGTERM outside SLURM while the driver itself runs (before a point's ranks start, or after they end:
    harness/driver/signals.py raises it): like Ctrl-C's KeyboardInterrupt, not an Exception, so nothing on the way
    catches it as a failure."""


def ends_the_sweep(status: str, place: NodePlace) -> bool:
    """Ctrl-C or SIGHUP (`interrupted`) end a sweep after their point; so does SIGTERM (`preempted`) outside SLURM,
    where nobody requeues the point and the sender wants the sweep gone. A SLURM preemption ends only its point."""
    return status == "interrupted" or (status == "preempted" and place.job_id is None)


def requeue_job(place: NodePlace) -> bool:
    """Put this SLURM job back in the queue (its point then runs again from step 0); True if SLURM took it."""
    if place.requeue_id is None or not shutil.which("scontrol"):
        return False
    out = subprocess.run(["scontrol", "requeue", place.requeue_id], capture_output=True, text=True, timeout=60)
    logger.warning(f"scontrol requeue {place.requeue_id}: " + (out.stderr.strip() or "ok"))
    return out.returncode == 0


# --- node failures: a failed node stops the others at once -------------------------------------------

def node_failure_path(run_dir: Path, node_rank: int) -> Path:
    return Path(run_dir) / runfiles.node_failure(node_rank)


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
