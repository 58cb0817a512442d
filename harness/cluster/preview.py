"""What SLURM would run for a sweep, shown before submitting it: the sbatch script submitit would submit
(rendered by submitit itself) and, for an example job (`--nodelist`, `--job-id`), the command and the
harness-set environment that every node's driver runs.

    python -m harness.cluster -m launcher=slurm launcher.nnodes=2 ...     # the sbatch script, node commands
"""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any, Mapping

from harness.contract import runfiles
from harness.cluster.launcher import with_requeue
from harness.cluster.nodes import expand_nodelist, node_command, this_node
from harness.config.compose import compose_point, sweep_points
from harness.contract.errors import ConfigError


def sbatch_script(launcher_params: Mapping[str, Any], n_points: int, python: str, requeue: bool) -> str:
    """The sbatch script the harness's SLURM launcher submits for a sweep (a job array, one task per point),
    rendered by submitit's own template from the resolved hydra.launcher section and launcher.requeue."""
    from submitit.slurm import slurm as submitit_slurm

    params = with_requeue({k: v for k, v in launcher_params.items() if k not in ("_target_", "max_num_timeout")},
                          requeue)
    folder = params.pop("submitit_folder")
    renames = submitit_slurm.SlurmExecutor._equivalence_dict()
    args = {renames.get(k, k): v for k, v in params.items()}
    if args.get("mem") is not None:
        args["mem"] = submitit_slurm._convert_mem(args["mem"])
    command = " ".join([shlex.quote(python), "-u -m submitit.core._submit", shlex.quote(folder)])
    return submitit_slurm._make_sbatch_string(command=command, folder=folder,
                                              map_count=n_points if n_points > 1 else None, **args)


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
    script = sbatch_script(launcher_params, len(points), "python", config["launcher"]["requeue"])
    script = script.replace(f"{Path.cwd()}/", "")
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
