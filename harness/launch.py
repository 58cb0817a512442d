"""Start a point's ranks with torchrun in their own process group, time them out, classify the outcome.

Each point runs in fresh processes, so an OOM, a dead rank or a hung collective is recorded as a
status instead of taking the sweep down with it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

STATUSES = ("ok", "oom", "died", "timeout", "preempted", "skipped", "config_error")
LOG_FILE = "worker.log"
_KILL_GRACE_S = 10


@dataclass
class LaunchResult:
    returncode: int | None
    timed_out: bool
    preempted: bool
    wall_time_s: float


def torchrun_command(run_dir: Path, launcher: dict[str, Any]) -> list[str]:
    """torchrun for one point: standalone on one node, else c10d rendezvous at launcher.rdzv_endpoint."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={launcher['nproc_per_node']}",
           "--max_restarts=0", "--monitor_interval=1"]
    nnodes = launcher.get("nnodes", 1)
    if nnodes == 1 and not launcher.get("rdzv_endpoint"):
        cmd.append("--standalone")
    else:
        cmd += [f"--nnodes={nnodes}", "--rdzv_backend=c10d", f"--rdzv_endpoint={launcher['rdzv_endpoint']}",
                f"--rdzv_id={launcher.get('rdzv_id', 'harness')}"]
    return cmd + ["-m", "harness.worker", str(run_dir)]


def worker_env(cfg: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    if cfg["env"]["pytorch_cuda_alloc_conf"]:
        env["PYTORCH_CUDA_ALLOC_CONF"] = cfg["env"]["pytorch_cuda_alloc_conf"]
    return env


def _pump(stream, log_path: Path, echo: Callable[[str], None]) -> None:
    """Copy worker output to the log; echo the per-step progress lines to the console."""
    with open(log_path, "a") as log:
        for line in stream:
            log.write(line)
            log.flush()
            if line.startswith("step "):
                echo(line.rstrip("\n"))


def run_workers(cmd: list[str], env: dict[str, str], run_dir: Path, timeout_s: float,
                echo: Callable[[str], None] = print) -> LaunchResult:
    """Run torchrun to completion, or kill its whole process group at the timeout or on SIGTERM
    (SLURM's preemption signal), recording which."""
    preempted = threading.Event()
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    pump = threading.Thread(target=_pump, args=(proc.stdout, run_dir / LOG_FILE, echo), daemon=True)
    pump.start()

    def on_sigterm(signum, frame):
        preempted.set()
        _kill_group(proc)

    previous = _install_sigterm(on_sigterm)
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
    finally:
        _restore_sigterm(previous)
    pump.join(timeout=5)
    return LaunchResult(proc.returncode, timed_out, preempted.is_set(), time.monotonic() - start)


def _install_sigterm(handler):
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, handler)


def _restore_sigterm(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the point's process group, then SIGKILL what is left after a grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=_KILL_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def rank_errors(run_dir: Path) -> list[dict]:
    """The error files the ranks left (error.rank<R>.json), in rank order."""
    errors = []
    for path in sorted(run_dir.glob("error.rank*.json")):
        try:
            errors.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            errors.append({"kind": "error", "message": f"unreadable {path.name}"})
    return errors


def classify(result: LaunchResult, run_dir: Path, steps_completed: int, steps_wanted: int) -> tuple[str, str | None]:
    """(status, reason) of a finished launch."""
    if result.preempted:
        return "preempted", f"SIGTERM after {steps_completed} of {steps_wanted} steps"
    if result.timed_out:
        return "timeout", f"no end after {result.wall_time_s:.0f} s ({steps_completed} of {steps_wanted} steps)"
    errors = rank_errors(run_dir)
    ooms = [e for e in errors if e["kind"] == "oom"]
    if ooms:
        return "oom", f"rank {ooms[0].get('rank')}: {ooms[0]['message']}"
    if result.returncode == 0 and steps_completed == steps_wanted:
        return "ok", None
    if errors:
        return "died", f"rank {errors[0].get('rank')}: {errors[0]['message']}"
    return "died", _failure_from_log(run_dir / LOG_FILE) or f"torchrun exit code {result.returncode}"


def _failure_from_log(log_path: Path) -> str | None:
    """torchrun's own account of a rank that died without an error file (a signal, say)."""
    if not log_path.exists():
        return None
    lines = log_path.read_text(errors="replace").splitlines()
    hits = [ln.strip() for ln in lines if "exitcode" in ln or "Signal" in ln]
    return hits[-1][:500] if hits else None
