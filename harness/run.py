"""The driver of one sweep point (the Hydra app): `python -m harness.run [overrides]`, `-m` to sweep.

validate -> run dir (config.yaml, env.json) -> torchrun workers -> classify -> summary.json -> W&B.
A failed point is recorded with its status and never raises into the sweep; a bad config in a
single run exits non-zero with one line naming the key.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from harness import dirnames
from harness.envinfo import REPO_ROOT

os.environ.setdefault("HARNESS_ROOT", str(REPO_ROOT))  # conf/config.yaml puts the repo root on the search path
dirnames.register()  # conf/hydra/default.yaml names the point folders with it

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from harness import arms, cluster, launch  # noqa: E402
from harness.envinfo import collect_env  # noqa: E402
from harness.errors import ConfigError  # noqa: E402
from harness.metrics import summarize_phases  # noqa: E402
from harness.sinks import STEPS_FILE, SUMMARY_FILE, mirror_to_wandb, read_jsonl, write_json_atomic  # noqa: E402
from harness.validate import check_group_choices, validate  # noqa: E402
from harness.worker import WORKER_FILE  # noqa: E402

CONFIG_ERROR_EXIT_CODE = 2
PLAN_ONLY = "plan_only=true"  # on the command line: print the sweep's plan instead of running it


def build_summary(config: dict, status: str, reason: str | None, rows: list[dict], wall_time_s: float,
                  worker_facts: dict) -> dict[str, Any]:
    phases = summarize_phases(rows)
    return {
        "status": status, "reason": reason,
        "arm": config["arm"]["name"], "model": config["model"]["name"],
        "world_size": worker_facts.get("world_size",
                                       config["launcher"]["nproc_per_node"] * config["launcher"]["nnodes"]),
        "steps_completed": len(rows), "wall_time_s": wall_time_s,
        "budget_bytes": worker_facts.get("budget_bytes"),
        "planned_offload_bytes": worker_facts.get("planned_offload_bytes"),
        "phases": phases, "final": phases[-1] if phases else None,
    }


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_point(config: dict, run_dir: Path, place: cluster.NodePlace) -> dict[str, Any]:
    """Launch this node's ranks of one validated point and return the point's summary (node 0 writes
    it to run_dir/summary.json; every node of a multi-node point runs this)."""
    env = collect_env(config)
    if place.primary:
        write_json_atomic(run_dir / "env.json", env)
    spec = arms.arm_spec(config["arm"]["name"])
    gpus = _gpu_count()
    if spec.needs_cuda and not gpus:
        return build_summary(config, "skipped", f"arm {spec.name} needs CUDA; this machine has no GPU", [], 0.0, {})

    cmd, worker_env = cluster.node_command(config, run_dir, place)
    multinode = config["launcher"]["nnodes"] > 1
    result = launch.run_workers(
        cmd, worker_env, run_dir, config["launcher"]["timeout_s"], log_name=cluster.log_name(place),
        stop_signals=cluster.stop_signals(), name_stop=lambda signum: cluster.stop_status(signum, place, time.time()),
        peer_failure=cluster.peer_failure_watch(run_dir, place) if multinode else None)
    if multinode and result.returncode != 0 and not (result.peer_failure or result.stopped_as or result.timed_out):
        cluster.write_node_failure(run_dir, place, result.returncode)  # the other nodes stop at once
    rows = read_jsonl(run_dir / STEPS_FILE)
    status, reason = launch.classify(result, run_dir, len(rows), config["train"]["steps"])
    facts_path = run_dir / WORKER_FILE
    facts = json.loads(facts_path.read_text()) if facts_path.exists() else {}
    if facts and place.primary:  # the ranks know the world they ran in
        env.update(world_size=facts["world_size"], hostnames=facts["hostnames"])
        write_json_atomic(run_dir / "env.json", env)
    return build_summary(config, status, reason, rows, result.wall_time_s, facts)


def print_phase_table(summary: dict) -> None:
    print(f"status: {summary['status']}" + (f" ({summary['reason']})" if summary["reason"] else ""))
    if not summary["phases"]:
        return
    print(f"{'phase':>5} {'steps':>5} {'n':>3} {'compile s':>9} {'median s':>9} {'p25 s':>8} {'p75 s':>8}"
          f" {'tok/s':>10} {'peak resv GB':>12}")
    for p in summary["phases"]:
        t, tok, resv = p["step_time_s"], p["tokens_per_s"]["median"], p["peak_reserved_bytes"]["max"]
        fmt = lambda v, w, d: f"{v:>{w}.{d}f}" if v is not None else f"{'-':>{w}}"  # noqa: E731
        print(f"{p['phase']:>5} {p['first_step']:>2}-{p['last_step']:<2} {p['n']:>3} {fmt(p['compile_time_s'], 9, 3)}"
              f" {fmt(t['median'], 9, 4)} {fmt(t['p25'], 8, 4)} {fmt(t['p75'], 8, 4)} {fmt(tok, 10, 0)}"
              f" {fmt(resv and resv / 1e9, 12, 2)}")


def drive(cfg: DictConfig) -> str:
    """One point, from composed config to recorded summary; returns the status."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    config = OmegaConf.to_container(cfg, resolve=True)
    place = cluster.this_node(nnodes=config["launcher"]["nnodes"])  # only global node 0's driver records the point
    if place.primary:
        cluster.set_aside_previous_attempt(run_dir)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    try:
        validate(config, _gpu_count())
        cluster.check_allocation(config["launcher"], place)
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        if place.primary:
            write_json_atomic(run_dir / SUMMARY_FILE,
                              build_summary(config, "config_error", str(error), [], 0.0, {}))
        if not multirun:
            sys.exit(CONFIG_ERROR_EXIT_CODE)
        return "config_error"

    summary = run_point(config, run_dir, place)
    if not place.primary:
        return summary["status"]
    write_json_atomic(run_dir / SUMMARY_FILE, summary)
    if config["logger"]["name"] == "wandb":
        env = json.loads((run_dir / "env.json").read_text())
        mirror_to_wandb(run_dir, config["logger"], config, read_jsonl(run_dir / STEPS_FILE), summary, env,
                        group=config["sweep"]["name"])
    print_phase_table(summary)
    if summary["status"] == "preempted" and config["launcher"].get("requeue") and cluster.requeue_job(place):
        sys.exit(os.EX_TEMPFAIL)  # SLURM runs the job again; submitit waits for it instead of a result
    return summary["status"]


@hydra.main(version_base="1.3", config_path=str(REPO_ROOT / "conf"), config_name="config")
def hydra_app(cfg: DictConfig) -> str:
    return drive(cfg)


def main() -> None:
    """Console entry: reject unknown group options in one line, then hand the command line to Hydra
    (or, with plan_only=true, print the plan of the points without launching anything)."""
    args = sys.argv[1:]
    try:
        check_group_choices(args, REPO_ROOT)
        if PLAN_ONLY in args:
            multirun = "-m" in args or "--multirun" in args
            cluster.print_plan([a for a in args if a not in (PLAN_ONLY, "-m", "--multirun")], multirun)
            return
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        sys.exit(CONFIG_ERROR_EXIT_CODE)
    hydra_app()


if __name__ == "__main__":
    main()
