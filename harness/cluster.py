"""Cluster scale: where this driver sits in a SLURM job, how its node joins the point's ranks, how a
SLURM stop is recorded, and two looks before submitting (the plan and the sbatch script).

    python -m harness.run -m experiments=pr8186_table plan_only=true    # points, GPUs, memory per rank
    python -m harness.cluster -m launcher=slurm launcher.nnodes=2 ...     # the sbatch script, node commands

With hydra-submitit-launcher every SLURM task (one per node) runs the driver of the same point; each
driver starts its node's ranks with torchrun, all joining one c10d rendezvous on the job's first node.
Global node 0's driver records the point; the others only run their ranks.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping

from harness import arms
from harness import runfiles
from harness.envinfo import REPO_ROOT
from harness.errors import ConfigError
from harness.units import GB

CONF_DIR = REPO_ROOT / "conf"
RDZV_PORT_BASE, RDZV_PORT_SPAN = 29500, 2000  # below Linux's ephemeral range, so no client socket holds it
# A stop signal this close to the job's end time is SLURM's time-limit warning (submitit asks for it
# signal_delay_s = 120 s ahead; SLURM may send it up to 60 s early).
TIME_LIMIT_WINDOW_S = 300


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
    """A multi-node point needs c10d and a SLURM job with exactly its node count."""
    backend, nnodes = launcher.get("rdzv_backend"), launcher["nnodes"]
    if backend not in (None, "c10d"):
        raise ConfigError("launcher.rdzv_backend", f"must be null (standalone) or c10d, got {backend!r}")
    if nnodes == 1:
        return
    if backend != "c10d":
        raise ConfigError("launcher.rdzv_backend", f"{nnodes} nodes join through a rendezvous: set it to c10d")
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
    """The launcher section with this point's c10d endpoint (the job's first host) and id filled in."""
    out = dict(launcher)
    if launcher.get("rdzv_backend") != "c10d" or launcher.get("rdzv_endpoint"):
        return out
    host = place.hosts[0] if launcher["nnodes"] > 1 else "localhost"
    port = rendezvous_port(launcher, place)
    out["rdzv_endpoint"] = f"{host}:{port}"
    out["rdzv_id"] = place.job_id or f"harness-{port}"
    return out


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


# --- the plan: points, GPUs, model-state memory per rank --------------------------------------------

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
ADAM_MOMENT_BYTES = 8  # exp_avg + exp_avg_sq, fp32


def model_state_bytes(n_params: int, world_size: int, dtype: str) -> dict[str, int]:
    """Per-rank bytes of ZeRO-3's partitioned model states: parameters and gradients in the training dtype,
    and the optimizer state (an fp32 master copy unless training in fp32, plus Adam's two fp32 moments)."""
    shard = -(-n_params // world_size)  # ceil: ZeRO-3 pads partitions up
    master = 0 if dtype == "fp32" else 4
    return {"params": shard * DTYPE_BYTES[dtype], "grads": shard * DTYPE_BYTES[dtype],
            "optimizer": shard * (master + ADAM_MOMENT_BYTES)}


def states_on_gpu(arm: arms.Arm, states: Mapping[str, int]) -> int:
    """Model-state bytes that must stay on the GPU: parameters and gradients, and the optimizer state unless the
    arm keeps it elsewhere (ZeRO-Offload on the CPU; the offload arms can move all of it out)."""
    keeps_optimizer = arm.keeps_optimizer_states_on_gpu
    return states["params"] + states["grads"] + (states["optimizer"] if keeps_optimizer else 0)


@lru_cache(maxsize=None)
def _parameter_count(model_json: str) -> int:
    from harness.models import count_parameters

    return count_parameters(json.loads(model_json))


def compose_point(overrides: list[str], with_hydra: bool = False, multirun: bool = False):
    """The config Hydra would compose for these overrides (nothing is run or written); `multirun`
    composes a sweep's primary config, where comma lists are allowed."""
    os.environ.setdefault("HARNESS_ROOT", str(REPO_ROOT))
    from hydra import initialize_config_dir

    from harness import dirnames
    dirnames.register()
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from hydra.types import RunMode

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        try:
            cfg = GlobalHydra.instance().hydra.compose_config(
                "config", list(overrides), run_mode=RunMode.MULTIRUN if multirun else RunMode.RUN, from_shell=False)
        except HydraException as error:
            raise ConfigError("overrides", str(error).splitlines()[0]) from error
    if not with_hydra:
        from omegaconf import open_dict

        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


def sweep_points(overrides: list[str], multirun: bool) -> list[list[str]]:
    """Each point's overrides, as Hydra's basic sweeper expands them: the config's
    hydra.sweeper.params, then the command line's comma lists (the command line wins)."""
    if not multirun:
        return [list(overrides)]
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = compose_point(overrides, with_hydra=True, multirun=True).hydra.sweeper.params or {}
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()] + list(overrides))
    return BasicSweeper.split_arguments(parsed, None)[0]


def _device_memory_bytes(config: Mapping[str, Any]) -> int | None:
    """What a point's ranks may use: the emulated device size if set, else launcher.gpu_memory_gb, else this GPU."""
    emulated = config["env"].get("device_memory_gb")
    if emulated is not None:
        return int(emulated * GB)
    launcher = config["launcher"]
    if launcher.get("gpu_memory_gb"):
        return int(launcher["gpu_memory_gb"] * GB)
    import torch

    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None


def plan_row(overrides: list[str]) -> dict[str, Any]:
    """One point of the plan: its GPUs and per-rank model-state bytes, or the config error it would hit."""
    from omegaconf import OmegaConf

    from harness.validate import validate

    config = OmegaConf.to_container(compose_point(overrides), resolve=True)
    launcher = config["launcher"]
    row: dict[str, Any] = {"overrides": overrides, "arm": config["arm"]["name"], "model": config["model"]["name"],
                           "nnodes": launcher["nnodes"], "nproc_per_node": launcher["nproc_per_node"],
                           "gpus": launcher["nnodes"] * launcher["nproc_per_node"], "error": None}
    try:
        validate(config, gpu_count=None)
    except ConfigError as error:
        return {**row, "error": str(error)}
    n_params = _parameter_count(json.dumps(config["model"], sort_keys=True))
    states = model_state_bytes(n_params, row["gpus"], config["train"]["dtype"])
    memory = _device_memory_bytes(config)
    on_gpu = states_on_gpu(arms.from_config(config["arm"]), states)
    return {**row, **states, "n_params": n_params, "on_gpu": on_gpu, "gpu_memory": memory,
            "fits": None if memory is None else on_gpu <= memory}


def _varying(points: list[list[str]]) -> list[list[str]]:
    """The overrides that tell points apart (all of them for a single point)."""
    if len(points) < 2:
        return points
    common = set.intersection(*(set(p) for p in points))
    return [[o for o in p if o not in common] for p in points]


def format_plan(rows: list[dict[str, Any]], labels: list[list[str]]) -> str:
    gpus = sorted({r["gpus"] for r in rows})
    memory = next((r["gpu_memory"] for r in rows if r.get("gpu_memory")), None)
    limit = f"{memory / GB:.1f} GB per GPU" if memory else "? (set launcher.gpu_memory_gb)"
    lines = [f"plan: {len(rows)} points, {'/'.join(map(str, gpus))} GPUs each ({sum(r['gpus'] for r in rows)} GPUs"
             " in all if they ran at once); nothing is launched or recorded.",
             "per rank, GB = 1e9 bytes: ZeRO-3 shards of the parameters and gradients (training dtype) and of the",
             "optimizer state (fp32 master + 2 Adam moments); 'on GPU' = the model states that must stay on the",
             f"device (activations not included); 'fits' = on GPU <= {limit}.",
             f"{'#':>3} {'GPUs':>4} {'nodes':>5} {'params':>7} {'grads':>7} {'optim':>7} {'on GPU':>7}"
             f" {'fits':>4}  point"]
    for i, (row, label) in enumerate(zip(rows, labels)):
        point = " ".join(label)
        if row["error"]:
            lines.append(f"{i:>3} {row['gpus']:>4} {row['nnodes']:>5} {'config error: ' + row['error']}  {point}")
            continue
        fits = "?" if row["fits"] is None else ("yes" if row["fits"] else "NO")
        lines.append(f"{i:>3} {row['gpus']:>4} {row['nnodes']:>5} {row['params'] / GB:>7.2f} {row['grads'] / GB:>7.2f}"
                     f" {row['optimizer'] / GB:>7.2f} {row['on_gpu'] / GB:>7.2f} {fits:>4}  {point}")
    return "\n".join(lines)


def print_plan(overrides: list[str], multirun: bool) -> None:
    """Plan-only mode: print every point of the sweep with its GPUs and per-rank memory; launch nothing."""
    points = sweep_points(overrides, multirun)
    print(format_plan([plan_row(point) for point in points], _varying(points)))


# --- what SLURM would run: the sbatch script and each node's command ----------------------------------

def sbatch_script(launcher_params: Mapping[str, Any], n_points: int, python: str) -> str:
    """The sbatch script hydra-submitit-launcher submits for a sweep (a job array, one task per point),
    rendered by submitit's own template from the resolved hydra.launcher section."""
    from submitit.slurm import slurm as submitit_slurm

    params = {k: v for k, v in launcher_params.items() if k not in ("_target_", "max_num_timeout")}
    folder = params.pop("submitit_folder")
    renames = submitit_slurm.SlurmExecutor._equivalence_dict()
    args = {renames.get(k, k): v for k, v in params.items()}
    if args.get("mem") is not None:
        args["mem"] = submitit_slurm._convert_mem(args["mem"])
    command = " ".join([shlex.quote(python), "-u -m submitit.core._submit", shlex.quote(folder)])
    return submitit_slurm._make_sbatch_string(command=command, folder=folder,
                                              map_count=n_points if n_points > 1 else None, **args)


def node_command(config: Mapping[str, Any], run_dir: Path, place: NodePlace,
                 cuda: bool | None = None) -> tuple[list[str], dict[str, str]]:
    """The torchrun command and worker environment this node's driver runs for a point."""
    from harness import launch

    launcher = launcher_for_node(config["launcher"], place)
    return launch.torchrun_command(run_dir, launcher), launch.worker_env(config, cuda)


def job_environment(hosts: list[str], node_rank: int, job_id: str) -> dict[str, str]:
    """The SLURM variables a task of a job on these hosts sees (for showing a job before it exists)."""
    return {"SLURM_JOB_ID": job_id, "SLURM_JOB_NODELIST": ",".join(hosts), "SLURM_JOB_NUM_NODES": str(len(hosts)),
            "SLURM_NODEID": str(node_rank)}


def format_job(overrides: list[str], multirun: bool, nodelist: str, job_id: str) -> str:
    """The sbatch script of a sweep, then the command and the variables the harness sets that every node
    of its first point's job would run (paths relative to the working directory)."""
    from omegaconf import OmegaConf

    points = sweep_points(overrides, multirun)
    hydra_cfg = compose_point(points[0] + ["hydra.job.name=run"], with_hydra=True)
    launcher_params = OmegaConf.to_container(hydra_cfg.hydra.launcher, resolve=True)
    config = OmegaConf.to_container(compose_point(points[0]), resolve=True)
    hosts = expand_nodelist(nodelist)
    if len(hosts) != config["launcher"]["nnodes"]:
        raise ConfigError("launcher.nnodes", f"{config['launcher']['nnodes']} nodes but --nodelist names {len(hosts)}")
    script = sbatch_script(launcher_params, len(points), python="python").replace(f"{Path.cwd()}/", "")
    array = ", a job array" if len(points) > 1 else ""
    lines = [f"# sbatch script for {len(points)} point{'s' * (len(points) > 1)} (one SLURM job per point{array})",
             script.rstrip(), "",
             f"# the driver of point 0 on each node of job {job_id} ({nodelist}) runs,"
             " in RUN_DIR = the point's run dir:"]
    for node_rank in range(len(hosts)):
        place = this_node(job_environment(hosts, node_rank, job_id))
        cmd, env = node_command(config, Path("RUN_DIR"), place, cuda=True)  # SLURM points run on GPU nodes
        harness_env = [f"{k}={shlex.quote(v)}" for k, v in env.items() if os.environ.get(k) != v]
        role = "records the point" if place.primary else "runs its ranks only"
        lines += [f"# node {node_rank} ({hosts[node_rank]}, {role}, log {runfiles.node_log(node_rank)}):",
                  " ".join(harness_env + [shlex.quote(word) for word in ["python", *cmd[1:]]])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m harness.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--multirun", action="store_true", help="expand the sweep, as harness.run -m does")
    parser.add_argument("--nodelist", default="gpu[01-02]", help="example hosts of the first point's job")
    parser.add_argument("--job-id", default="123456", help="example SLURM job id")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for harness.run")
    args = parser.parse_args(argv)
    try:
        print(format_job(args.overrides, args.multirun, args.nodelist, args.job_id))
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
