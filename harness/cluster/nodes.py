"""Where this driver sits in a SLURM job and how its node joins the point's ranks.

With hydra-submitit-launcher every SLURM task (one per node) runs the driver of the same point; each
driver starts its node's ranks with torchrun, all meeting at a rendezvous on the job's first node. Node K of
the job holds global ranks K x nproc_per_node and up (torchrun's static rendezvous with --node_rank), so
global rank 0, which writes steps.jsonl, runs beside the driver that records the point: global node 0's.
The others only run their ranks.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from harness.contract.errors import ConfigError

RDZV_PORT_BASE, RDZV_PORT_SPAN = 29500, 2000  # below Linux's ephemeral range, so no client socket holds it


# --- where this driver sits -------------------------------------------------------------------------

@dataclass(frozen=True)
class NodePlace:
    """This driver's node within the point's job (node 0 of 1 outside SLURM)."""
    node_rank: int
    nnodes: int
    hosts: tuple[str, ...]
    job_id: str | None = None       # SLURM_JOB_ID: unique per array task
    requeue_id: str | None = None   # what `scontrol requeue` takes (ARRAYJOB_TASK for an array task)
    attempt: int = 0                # SLURM_RESTART_COUNT: how often the job was requeued
    end_time: float | None = None   # SLURM_JOB_END_TIME: when the time limit strikes (epoch s)

    @property
    def primary(self) -> bool:
        return self.node_rank == 0


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compact host list, `gpu[01-03,07],login1` -> gpu01 gpu02 gpu03 gpu07 login1 (padding kept)."""
    return [host for item in _split_outside_brackets(nodelist) for host in _expand_host(item)]


def _split_outside_brackets(text: str) -> list[str]:
    items, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    return [item for item in items + [current] if item]


def _expand_host(pattern: str) -> list[str]:
    match = re.match(r"^([^\[]*)\[([^\]]+)\](.*)$", pattern)
    if not match:
        return [pattern]
    prefix, ranges, rest = match.groups()
    heads = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        numbers = range(int(low), int(high) + 1) if high else [int(low)]
        heads += [f"{prefix}{n:0{len(low)}d}" for n in numbers]
    return [head + tail for head in heads for tail in _expand_host(rest)]


def slurm_hostnames(nodelist: str) -> list[str]:
    """The job's hosts in SLURM's order: `scontrol show hostnames` where SLURM is installed, else our parser."""
    if shutil.which("scontrol"):
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=30)
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()
    return expand_nodelist(nodelist)


def this_node(environ: Mapping[str, str] = os.environ, nnodes: int | None = None) -> NodePlace:
    """Read the SLURM job environment of this task (one task per node); node 0 of 1 without SLURM.
    A single-node point (`nnodes=1`) is always its own node 0, whichever node of an allocation runs it."""
    if "SLURM_JOB_ID" not in environ:
        return NodePlace(0, 1, (socket.gethostname(),))
    node_rank = 0 if nnodes == 1 else int(environ.get("SLURM_NODEID", 0))
    array_job, array_task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    end_time = environ.get("SLURM_JOB_END_TIME")
    return NodePlace(
        node_rank=node_rank,
        nnodes=int(environ.get("SLURM_JOB_NUM_NODES", environ.get("SLURM_NNODES", 1))),
        hosts=tuple(slurm_hostnames(environ.get("SLURM_JOB_NODELIST", socket.gethostname()))),
        job_id=environ["SLURM_JOB_ID"],
        requeue_id=f"{array_job}_{array_task}" if array_job and array_task else environ["SLURM_JOB_ID"],
        attempt=int(environ.get("SLURM_RESTART_COUNT", 0)),
        end_time=float(end_time) if end_time else None,
    )


# --- how this node joins the point's ranks ------------------------------------------------------------

def check_allocation(launcher: Mapping[str, Any], place: NodePlace) -> None:
    """A multi-node point needs the static rendezvous and a SLURM job with exactly its node count (the schema
    has refused any other backend already)."""
    backend, nnodes = launcher.get("rdzv_backend"), launcher["nnodes"]
    if nnodes == 1:
        return
    if backend != "static":
        raise ConfigError("launcher.rdzv_backend", f"{nnodes} nodes need static (SLURM node K holds ranks "
                          "K x nproc_per_node and up); c10d ranks nodes in the order they join, so global rank 0 "
                          "could run on any node")
    if place.job_id is None:
        raise ConfigError("launcher.nnodes", f"{nnodes} nodes need a SLURM job (launcher=slurm)")
    if place.nnodes != nnodes:
        raise ConfigError("launcher.nnodes", f"{nnodes} nodes configured but SLURM job {place.job_id} has "
                          f"{place.nnodes}; set hydra.launcher.nodes to launcher.nnodes")


def rendezvous_port(launcher: Mapping[str, Any], place: NodePlace) -> int:
    """Every node must agree on the port without talking: launcher.rdzv_port, else one derived from the
    job id; a single-node point takes any free port (points running side by side must not meet)."""
    if launcher.get("rdzv_port"):
        return int(launcher["rdzv_port"])
    if launcher["nnodes"] > 1:
        return RDZV_PORT_BASE + int(place.job_id) % RDZV_PORT_SPAN
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def launcher_for_node(launcher: Mapping[str, Any], place: NodePlace) -> dict[str, Any]:
    """The launcher section with this point's rendezvous endpoint (the job's first host), id and this node's
    rank filled in."""
    out = dict(launcher, node_rank=place.node_rank)
    if launcher.get("rdzv_backend") is None or launcher.get("rdzv_endpoint"):
        return out
    host = place.hosts[0] if launcher["nnodes"] > 1 else "localhost"
    port = rendezvous_port(launcher, place)
    out["rdzv_endpoint"] = f"{host}:{port}"
    out["rdzv_id"] = place.job_id or f"harness-{port}"
    return out


def node_command(config: Mapping[str, Any], run_dir: Path, place: NodePlace,
                 cuda: bool | None = None) -> tuple[list[str], dict[str, str]]:
    """The torchrun command and worker environment this node's driver runs for a point."""
    launcher = launcher_for_node(config["launcher"], place)
    return torchrun_command(run_dir, launcher), worker_env(config, cuda)


def torchrun_command(run_dir: Path, launcher: dict[str, Any]) -> list[str]:
    """torchrun for one point: standalone on one node, else a rendezvous at launcher.rdzv_endpoint: c10d (ranks
    by join order) or static (this node's ranks fixed by launcher.node_rank)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={launcher['nproc_per_node']}",
           "--max_restarts=0", "--monitor_interval=1"]
    nnodes, backend = launcher.get("nnodes", 1), launcher.get("rdzv_backend") or "c10d"
    if nnodes == 1 and not launcher.get("rdzv_endpoint"):
        return cmd + ["--standalone", "-m", "harness.rank.worker", str(run_dir)]
    cmd += [f"--nnodes={nnodes}", f"--rdzv_backend={backend}", f"--rdzv_endpoint={launcher['rdzv_endpoint']}",
            f"--rdzv_id={launcher.get('rdzv_id', 'harness')}"]
    if backend == "static":
        cmd.append(f"--node_rank={launcher.get('node_rank', 0)}")
    if launcher.get("dist_timeout_min"):  # a node that never joins fails the point, like a hung collective
        timeout_key = "timeout" if backend == "static" else "join_timeout"
        cmd.append(f"--rdzv_conf={timeout_key}={int(launcher['dist_timeout_min'] * 60)}")
    return cmd + ["-m", "harness.rank.worker", str(run_dir)]


def worker_env(cfg: dict[str, Any], cuda: bool | None = None) -> dict[str, str]:
    """The environment of this node's ranks (the driver adds the arm class it admitted, harness.arms.ADMITTED_ENV)."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if cuda is None:
        import torch
        cuda = torch.cuda.is_available()
    if not cuda:  # CPU ranks share a few cores: one thread each avoids oversubscription (10x slower steps)
        env.setdefault("OMP_NUM_THREADS", "1")
    # A dead peer or a hung collective must end the point (as `died`), not hang it: NCCL's watchdog tears
    # the rank down once a collective outlives the process-group timeout (DeepSpeed reads it, in minutes).
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if cfg["launcher"].get("dist_timeout_min"):
        env["DEEPSPEED_TIMEOUT"] = str(int(cfg["launcher"]["dist_timeout_min"]))
    if cfg["env"]["pytorch_cuda_alloc_conf"]:
        env["PYTORCH_CUDA_ALLOC_CONF"] = cfg["env"]["pytorch_cuda_alloc_conf"]
    return env
