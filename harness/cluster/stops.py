"""How a point is stopped from outside its ranks: SLURM's stop signals (its time limit, a preemption) and the
status each is recorded as, a requeue, a SIGTERM outside SLURM ending the sweep, and a failed node stopping the
point's other nodes at once.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Mapping

from harness import runfiles
from harness.cluster.nodes import NodePlace

# A stop signal this close to the job's end time is SLURM's time-limit warning (submitit asks for it
# signal_delay_s = 120 s ahead; SLURM may send it up to 60 s early).
TIME_LIMIT_WINDOW_S = 300


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


class Terminated(BaseException):
    """SIGTERM outside SLURM while the driver itself runs (between points, or before a point's ranks start): like
    Ctrl-C's KeyboardInterrupt, not an Exception, so nothing on the way catches it as a failure."""


def end_on_sigterm(environ: Mapping[str, str] = os.environ) -> None:
    """Outside SLURM, a SIGTERM (kill, timeout, docker stop, a CI runner's cancel) ends the sweep: raise Terminated
    in the driver (while a point's ranks run, run_workers stops them first and records the point `preempted`).
    Under SLURM, SIGTERM is a preemption the job's own handling answers."""
    if "SLURM_JOB_ID" in environ or threading.current_thread() is not threading.main_thread():
        return

    def terminate(signum, frame):
        raise Terminated("SIGTERM")

    signal.signal(signal.SIGTERM, terminate)


def ends_the_sweep(status: str, place: NodePlace) -> bool:
    """Ctrl-C or SIGHUP (`interrupted`) end a sweep after their point; so does SIGTERM (`preempted`) outside SLURM,
    where nobody requeues the point and the sender wants the sweep gone. A SLURM preemption ends only its point."""
    return status == "interrupted" or (status == "preempted" and place.job_id is None)


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
