"""Start a point's ranks with torchrun in their own process group (the command is harness/cluster/nodes.py's), time
them out, record what a failed launch leaves (killed ranks, a failed node), classify the outcome.

Each point runs in fresh processes, so an OOM, a dead rank or a hung collective is recorded as a
status instead of taking the sweep down with it.
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import psutil

from harness.cluster import stops
from harness.cluster.nodes import NodePlace
from harness.contract import runfiles, safe_read
from harness.driver import buildlocks, op_builds

INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGHUP)  # Ctrl-C, a closed terminal: the point ends as `interrupted`
_KILL_GRACE_S = 10
_POLL_S = 1.0  # how often the launch loop checks the timeout and the point's other nodes
# After another node failed, how long this node's torchrun may take to end on its own before it is stopped: a rank
# of this node killed by a signal may be what failed the other node, and torchrun reports it as it ends.
_PEER_GRACE_S = 3.0


@dataclass
class LaunchResult:
    returncode: int | None
    timed_out: bool
    wall_time_s: float
    stopped_as: str | None = None    # "preempted" | "timeout" (SLURM's stop signals) | "interrupted" (Ctrl-C, SIGHUP)
    stop_signal: str | None = None   # its name, e.g. SIGTERM
    peer_failure: str | None = None  # another node of a multi-node point failed first
    stalled: str | None = None       # no new step for launcher.stall_timeout_s: why, naming the last step
    op_build_s: float = 0.0          # the ops this point built just in time (op_builds.py), on this node


def _pump(stream, log_path: Path, echo: Callable[[str], None]) -> None:
    """Copy worker output to the log; echo the per-step progress lines to the console."""
    with runfiles.open_append(log_path) as log:
        for line in stream:
            log.write(line)
            log.flush()
            if line.startswith("step "):
                echo(line.rstrip("\n"))


def run_workers(cmd: list[str], env: dict[str, str], run_dir: Path, timeout_s: float,
                echo: Callable[[str], None] = print, *, log_name: str = runfiles.LOG,
                stop_signals: tuple[int, ...] = (signal.SIGTERM,),
                name_stop: Callable[[int], str] = lambda signum: "preempted",
                peer_failure: Callable[[], str | None] | None = None,
                stall: Callable[[], str | None] | None = None) -> LaunchResult:
    """Run torchrun to completion, or stop every process of the point (SIGTERM, SIGKILL after a grace period)
    at the timeout, when `stall` reports that the ranks stopped making progress, on a stop signal (SLURM's
    preemption or time-limit warning; `name_stop` names the status), on Ctrl-C or SIGHUP (`interrupted`), or
    when `peer_failure` reports that another node of the point failed, recording which. A second signal while
    stopping kills at once. No process of the point outlives this call, however it ends, and no build lock is left
    that no build holds: one is cleared before the launch and after (harness/driver/buildlocks.py), so an op build
    stopped mid-way never makes a later point wait forever."""
    stop: dict[str, str] = {}
    point: list[PointProcesses] = []  # filled once torchrun runs; a signal may come before

    def on_signal(signum, frame):
        if stop:  # asked twice: no more grace
            for processes in point:
                processes.track()  # ranks started since the last poll too
                processes.signal_all(signal.SIGKILL)
            return
        stop["status"] = "interrupted" if signum in INTERRUPT_SIGNALS else name_stop(signum)
        stop["signal"] = signal.Signals(signum).name

    with runfiles.open_append(run_dir / log_name) as log:  # which command each node ran heads its log
        log.write(f"$ {shlex.join(cmd)}\n")
    buildlocks.clear_stale_locks(env)
    previous = _install_handlers(tuple(dict.fromkeys((*stop_signals, *INTERRUPT_SIGNALS))), on_signal)
    start, launched_at = time.monotonic(), time.time()
    timed_out, failed_peer, stalled, pump = False, None, None, None
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        point.append(PointProcesses(proc))
        pump = threading.Thread(target=_pump, args=(proc.stdout, run_dir / log_name, echo), daemon=True)
        pump.start()
        while proc.poll() is None and not stop:
            point[0].track()
            timed_out = time.monotonic() - start >= timeout_s
            failed_peer = None if timed_out or peer_failure is None else peer_failure()
            stalled = None if timed_out or failed_peer or stall is None else stall()
            if failed_peer:
                _wait_quietly(proc, _PEER_GRACE_S)
            if timed_out or failed_peer or stalled:
                break
            try:
                proc.wait(timeout=max(0.0, min(_POLL_S, timeout_s - (time.monotonic() - start))))
            except subprocess.TimeoutExpired:
                continue
    finally:
        for processes in point:
            processes.stop()  # our handlers stay in place meanwhile: a second Ctrl-C kills at once
        buildlocks.clear_stale_locks(env)  # an op build the stop ended mid-way
        _restore_handlers(previous)
    if pump is not None:
        pump.join(timeout=5)
    return LaunchResult(proc.returncode, timed_out and not stop, time.monotonic() - start,
                        stop.get("status"), stop.get("signal"), failed_peer, None if stop else stalled,
                        op_builds.build_seconds(buildlocks.extensions_root(env), launched_at))


def _wait_quietly(proc: subprocess.Popen, seconds: float) -> None:
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pass


def _install_handlers(signums: tuple[int, ...], handler) -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.signal(signum, handler) for signum in signums}


def _restore_handlers(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


class PointProcesses:
    """torchrun and every process below it. torchrun starts each rank in a session of its own, so signalling
    torchrun's process group does not reach the ranks, and once torchrun is gone nothing links them to us:
    every process seen below torchrun while the point runs is remembered and signalled as well."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self._seen: dict[int, psutil.Process] = {}

    def track(self) -> None:
        try:
            below = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return
        self._seen = {**self._seen, **{child.pid: child for child in below}}  # one assignment: a handler reads it

    def signal_all(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for child in list(self._seen.values()):
            try:
                child.send_signal(sig)  # psutil refuses a pid that now belongs to another process
            except psutil.Error:
                pass

    def alive(self) -> bool:
        if self.proc.poll() is None:
            return True
        for child in list(self._seen.values()):
            try:
                if child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
                    return True
            except psutil.Error:
                continue
        return False

    def stop(self) -> None:
        """SIGTERM every process of the point, then SIGKILL what is left after a grace period."""
        self.track()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not self.alive():
                return
            self.signal_all(sig)
            deadline = time.monotonic() + _KILL_GRACE_S
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.1)


def rank_errors(run_dir: Path) -> list[dict]:
    """The error files the ranks left (error.rank<R>.json), in rank order."""
    errors = []
    for path in sorted(run_dir.glob(runfiles.RANK_ERRORS)):
        try:
            errors.append(safe_read.read_json(path, run_dir))
        except (OSError, ValueError):  # safe_read.RefusedFile too
            errors.append({"kind": "error", "message": f"unreadable {path.name}"})
    return errors


# One entry of torchrun's failure report (its ChildFailedError): the global rank, then its exit code (-N: signal N).
_TORCHRUN_FAILURE = re.compile(r"^\s*rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)", re.M)


def killed_ranks(log_path: Path) -> dict[int, str]:
    """The ranks that torchrun's failure report in this node's log says a signal killed: {global rank: signal
    name}. SIGTERM is left out: torchrun, the harness and SLURM stop ranks with it, so it names no cause."""
    if not log_path.exists():
        return {}
    killed = {}
    for rank, exitcode in _TORCHRUN_FAILURE.findall(log_path.read_text(errors="replace")):
        signum = -int(exitcode)
        if signum > 0 and signum != signal.SIGTERM:
            killed[int(rank)] = signal.Signals(signum).name if signum in signal.valid_signals() else f"signal {signum}"
    return killed


def record_killed_ranks(run_dir: Path, log_name: str, node: str) -> dict[int, str]:
    """A rank killed by a signal writes no error file: its node's driver writes one from torchrun's report
    (`node` says where, e.g. "node 1 (gpu02)"), so the node that records the point sees the cause too. Returns
    the killed ranks (rank -> signal name)."""
    killed = killed_ranks(run_dir / log_name)
    for rank, name in killed.items():
        path = run_dir / runfiles.rank_error(rank)
        if not path.exists():
            runfiles.write_json(path, {"kind": "killed", "rank": rank, "message": f"killed by {name} on {node}"})
    return killed


def report_failure(result: LaunchResult, run_dir: Path, place: NodePlace, log_name: str,
                   peers: Callable[[], str | None] | None) -> None:
    """What this node's failed launch leaves for the point's record: an error file for each of its ranks a
    signal killed; on a multi-node point, its failure (the other nodes stop at once) and, on node 0, the failure
    another node reports (in `result.peer_failure`) when no rank of node 0 was killed: the cause may be there."""
    if result.returncode == 0 or result.stopped_as or result.timed_out:
        return
    died = not result.stalled  # else the harness stopped the ranks
    killed = record_killed_ranks(run_dir, log_name, f"node {place.node_rank} ({socket.gethostname()})") \
        if died else {}
    if peers is None or result.peer_failure:
        return
    stops.write_node_failure(run_dir, place, result.returncode)
    if died and place.primary and not killed:
        result.peer_failure = stops.await_peer_failure(peers)


def classify(result: LaunchResult, run_dir: Path, steps_completed: int, steps_wanted: int) -> tuple[str, str | None]:
    """(status, reason) of a finished launch. Of a point that died, the cause: a rank a signal killed (the others'
    errors, a dead peer's "connection reset", follow from it), else another node's failure, else a rank's error."""
    if result.stopped_as:
        return result.stopped_as, f"{result.stop_signal} after {steps_completed} of {steps_wanted} steps"
    if result.timed_out:
        return "timeout", f"no end after {result.wall_time_s:.0f} s ({steps_completed} of {steps_wanted} steps)"
    if result.stalled:
        return "timeout", result.stalled
    errors = rank_errors(run_dir)
    ooms = [e for e in errors if e["kind"] == "oom"]
    if ooms:
        return "oom", f"rank {ooms[0].get('rank')}{_where(ooms[0])}: {ooms[0]['message']}"
    refused = [e for e in errors if e["kind"] == "config_error"]  # offload.if_infeasible=refuse, at planning
    if refused:
        return "config_error", f"rank {refused[0].get('rank')}: {refused[0]['message']}"
    if result.returncode == 0 and steps_completed == steps_wanted:
        return "ok", None
    killed = [e for e in errors if e["kind"] == "killed"]
    if killed:
        return "died", f"rank {killed[0]['rank']}: {killed[0]['message']}"
    if result.peer_failure:  # the cause; this node's rank errors are its symptoms
        return "died", result.peer_failure
    if errors:
        return "died", f"rank {errors[0].get('rank')}: {errors[0]['message']}"
    return "died", _failure_from_log(run_dir / runfiles.LOG) or f"torchrun exit code {result.returncode}"


OOM_FACTS = ("rank", "step", "phase", "stage", "requested_bytes", "free_bytes", "limit_bytes", "reserved_bytes",
             "allocated_bytes", "message")


def _where(error: dict) -> str:
    """' at step 3 (phase 1)' or ' before step 0' for an error file that says where the rank was."""
    if error.get("stage") == "build":
        return " before step 0"
    return f" at step {error['step']} (phase {error['phase']})" if error.get("step") is not None else ""


def oom_facts(run_dir: Path) -> dict | None:
    """The first out-of-memory error of the ranks (in rank order): where it happened and by how much."""
    ooms = [e for e in rank_errors(run_dir) if e["kind"] == "oom"]
    return {key: ooms[0].get(key) for key in OOM_FACTS} if ooms else None


def _failure_from_log(log_path: Path) -> str | None:
    """torchrun's own account of a rank that died without an error file (a signal, say)."""
    if not log_path.exists():
        return None
    lines = log_path.read_text(errors="replace").splitlines()
    hits = [ln.strip() for ln in lines if "exitcode" in ln or "Signal" in ln]
    return hits[-1][:500] if hits else None
