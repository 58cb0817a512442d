"""The driver of one sweep point (the Hydra app): `python -m harness.run [overrides]`, `-m` to sweep.

check the command line -> resolve and validate -> run dir (config.yaml, env.json) -> torchrun workers -> classify
-> summary.json -> W&B. A failed point is recorded with its status and never raises into the sweep (a refused
config is `config_error`, a failure of the driver itself `error`); a bad config exits 2 with one line naming the
key. Ctrl-C (or SIGHUP) stops the point's ranks, records it `interrupted` with the steps done, writes the sweep's
index and exits 130; a second Ctrl-C kills the ranks at once. Outside SLURM a SIGTERM does the same, the point
recorded `preempted`, and exits 143. So do they when no ranks run: before a point's launch, between points, during
the W&B mirror (harness/driver/signals.py). Exit codes: harness/contract/exits.py.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from harness.config import dirnames
from harness.contract.envinfo import REPO_ROOT

os.environ.setdefault("HARNESS_ROOT", str(REPO_ROOT))  # conf/config.yaml puts the repo root on the search path
dirnames.register()  # conf/hydra/default.yaml names the point folders with it

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from harness import arms  # noqa: E402
from harness.config import compose  # noqa: E402
from harness.driver import console, estimate, launch, progress, resume, signals, stop_at  # noqa: E402
from harness.rank import emulated_device, machine  # noqa: E402
from harness.contract import exits, logs, protocol, runfiles, safe_read, schema  # noqa: E402
from harness.cluster import nodes, stops  # noqa: E402
from harness.contract.checks import is_usable_number, lookup  # noqa: E402
from harness.contract.envinfo import collect_env  # noqa: E402
from harness.contract.errors import ConfigError  # noqa: E402
from harness.contract.schema.groups import check_emulated_size  # noqa: E402
from harness.contract.budget import finished_peak_bytes, over_budget_bytes  # noqa: E402
from harness.contract.steps import summarize_phases  # noqa: E402
from harness.contract.runfiles import read_jsonl, write_atomic, write_json  # noqa: E402
from harness.driver.sinks import SweepIndexCallback, mirror_to_wandb  # noqa: E402
from harness.driver.validate import check_group_choices, validate  # noqa: E402

CONFIG_ERROR_EXIT_CODE = exits.CONFIG_ERROR
logger = logging.getLogger(__name__)


def build_summary(config: dict, status: str, reason: str | None, rows: list[dict], wall_time_s: float,
                  worker_facts: dict, oom: dict | None = None) -> dict[str, Any]:
    """`oom`: where and by how much the point ran out (launch.oom_facts), for an `oom` point."""
    warmup = _warmup_steps(config.get("train") or {})
    phases = summarize_phases(rows, warmup)
    final_rows = [row for row in rows if phases and row["phase"] == phases[-1]["phase"]]
    return {
        "status": status, "reason": reason,
        "arm": lookup(config, "arm.name", None), "model": lookup(config, "model.name", None),
        "world_size": worker_facts.get("world_size", _configured_world_size(config.get("launcher") or {})),
        "steps_completed": len(rows), "wall_time_s": wall_time_s, "startup_s": worker_facts.get("startup_s"),
        "op_build_s": worker_facts.get("op_build_s"),  # this machine's one-time op builds (driver/op_builds.py)
        "budget_bytes": worker_facts.get("budget_bytes"),
        "planned_offload_bytes": worker_facts.get("planned_offload_bytes"),
        "predicted_peak_bytes": worker_facts.get("predicted_peak_bytes"),
        "over_budget_bytes": over_budget_bytes(worker_facts.get("budget_bytes"),
                                               worker_facts.get("predicted_peak_bytes"),
                                               finished_peak_bytes(status, rows)),
        "device_memory_bytes": _emulated_size_bytes(config.get("env") or {}), "oom": oom,
        "warmup_steps": warmup,
        **protocol.steadiness([row for row in final_rows if protocol.is_measured(row, warmup)]),
        "machine": _machine_summary(worker_facts.get("machine")),
        # where the first steps' and the rest's time went, and the profile cache's key (harness/rank/wall_split.py)
        "wall_split": worker_facts.get("wall_split"), "profile_cache": worker_facts.get("profile_cache"),
        "phases": phases, "final": phases[-1] if phases else None,
    }


def _warmup_steps(train: dict) -> int:
    """train.warmup_steps, 0 where it is not a count (a refused config)."""
    warmup = train.get("warmup_steps")
    return warmup if type(warmup) is int and warmup >= 0 else 0


def _machine_summary(readings: dict | None) -> dict | None:
    """The ranks' machine readings at the start and end of the measured steps, with what makes them suspect."""
    if not readings:
        return None
    return {"start": readings["start"], "end": readings["end"],
            "flags": machine.flags(readings["start"], readings["end"], readings["pids"])}


def _emulated_size_bytes(env: dict) -> int | None:
    """env.device_memory_gb in bytes, None where it is null or no usable number (a refused config)."""
    size = env.get("device_memory_gb")
    return emulated_device.size_bytes(size) if is_usable_number(size) else None


def _configured_world_size(launcher: dict) -> int | None:
    """nnodes x nproc_per_node, or None where they are not usable integers (a refused config)."""
    sizes = (launcher.get("nproc_per_node"), launcher.get("nnodes"))
    return sizes[0] * sizes[1] if all(type(n) is int and is_usable_number(n) for n in sizes) else None


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _device_total_bytes() -> int | None:
    """This node's first GPU's memory (None without CUDA): an emulated device must be smaller."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None


def run_point(config: schema.Config, run_dir: Path, place: nodes.NodePlace) -> dict[str, Any]:
    """Launch this node's ranks of one validated point and return the point's summary (node 0 writes
    it to run_dir/summary.json; every node of a multi-node point runs this)."""
    env, diff = collect_env(config, run_dir)
    if place.primary:
        write_json(run_dir / runfiles.ENV, env)
        if diff is not None:  # the code that ran, where it was not its commit's
            write_atomic(run_dir / runfiles.DIFF, diff)
    arm = config.arm
    gpus = _gpu_count()
    if arm.needs_cuda and not gpus:
        reason = f"arm {arm.name} needs CUDA; this machine has no GPU"
        return build_summary(config.written, "skipped", reason, [], 0.0, {})

    cmd, worker_env = nodes.node_command(config.written, run_dir, place)
    admitted = arms.handed_to_ranks(config.written["arm"])  # the class path (_target_), which only the dict has
    if admitted:  # an arm from the driver's command line: the ranks may import it on their driver's word
        worker_env[arms.ADMITTED_ENV] = admitted
    launcher, steps = config.launcher, config.train.steps
    multinode, log_name = launcher.nnodes > 1, runfiles.node_log(place.node_rank)
    stall = progress.first_of(
        progress.StartupWatch(run_dir, launcher.startup_timeout_s, log_name) if launcher.startup_timeout_s else None,
        progress.StallWatch(run_dir, launcher.stall_timeout_s, steps) if launcher.stall_timeout_s else None)
    peers = stops.peer_failure_watch(run_dir, place) if multinode else None
    end_time = stops.job_end_time(place)
    result = launch.run_workers(
        cmd, worker_env, run_dir, launcher.timeout_s, log_name=log_name, stop_signals=stops.stop_signals(),
        name_stop=lambda signum: stops.stop_status(signum, end_time, time.time()), peer_failure=peers, stall=stall)
    launch.report_failure(result, run_dir, place, log_name, peers)
    rows = read_jsonl(run_dir / runfiles.STEPS)
    status, reason = launch.classify(result, run_dir, len(rows), steps)
    facts_path = run_dir / runfiles.WORKER
    facts = read_worker_facts(facts_path)
    if facts and place.primary:  # the ranks know the world they ran in
        env.update(world_size=facts["world_size"], hostnames=facts["hostnames"])
        write_json(run_dir / runfiles.ENV, env)
    oom = launch.oom_facts(run_dir) if status == "oom" else None
    facts = {**facts, "op_build_s": round(result.op_build_s, 3)}  # measured here, beside what the ranks saw
    return build_summary(config.written, status, reason, rows, result.wall_time_s, facts, oom)


def read_worker_facts(facts_path: Path) -> dict:
    """worker.json, what the ranks saw; {} where they wrote none, and, with one warning line, where it is no object
    safe_read reads (a run dir's files are read by its rules, the driver's own included)."""
    try:
        facts = safe_read.read_json(facts_path, facts_path.parent)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:  # safe_read.RefusedFile too
        logger.warning(f"warning: {facts_path}: not read ({traceback_last_line(error)})")
        return {}
    return facts if isinstance(facts, dict) else {}


def drive(cfg: DictConfig) -> str:
    """One point, from composed config to recorded summary; returns the status. In a multirun nothing raises
    into the sweep (Hydra would then skip the sweep's index); a signal that stops the point ends the sweep after
    it (stops.ends_the_sweep); a single point exits with its status's code (harness/contract/exits.py)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    place = nodes.this_node(nnodes=OmegaConf.select(cfg, "launcher.nnodes", throw_on_resolution_failure=False))
    signals.install()  # also where a cluster job runs this point without main()
    try:
        with signals.interruptible():
            status = record_point(cfg, run_dir, place, sweep_dir=run_dir.parent if multirun else None)
    except stops.Terminated:  # SIGTERM outside SLURM while the driver itself ran (run_workers handles it there)
        status = record_failure(cfg, run_dir, place, "preempted", "SIGTERM in the driver")
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGHUP outside the ranks' run (run_workers handles them there)
        status = record_failure(cfg, run_dir, place, "interrupted", f"{_signal_name(stop)} in the driver")
    except Exception as error:
        stopped = signals.received()  # a signal may surface as another error, raised while handling it
        if stopped is not None:
            status = record_failure(cfg, run_dir, place, signals.status_of(stopped),
                                    f"{signal.Signals(stopped).name} in the driver")
        else:
            traceback.print_exc()
            status = record_failure(cfg, run_dir, place, "error", traceback_last_line(error))
    if stops.ends_the_sweep(status, place):
        stop_the_sweep(run_dir, multirun, status)
    if not multirun and exits.point_exit_code(status) != exits.OK:
        sys.exit(exits.point_exit_code(status))
    return status


def _signal_name(stop: KeyboardInterrupt) -> str:
    """The signal a KeyboardInterrupt stands for: the one signals.py named, else Ctrl-C's."""
    return str(stop.args[0]) if stop.args and str(stop.args[0]).startswith("SIG") else "SIGINT"


def checked_config(resolved: dict, place: nodes.NodePlace) -> schema.Config:
    """The point's resolved config checked as the driver launches it and typed, with its step counts settled:
    train.steps the total, train.measure_steps the final phase's measured count (harness/contract/protocol.py);
    ConfigError naming the key at fault."""
    arms.admit(resolved.get("arm"))  # the arm this command line names; readers of the run dir never import it
    config = validate(resolved, _gpu_count())
    check_emulated_size(config.env.device_memory_gb, config.env.reserved_cap_gb, _device_total_bytes())
    nodes.check_allocation(resolved["launcher"], place)
    counts = protocol.step_counts(config.train, config.arm.phase_start_steps(config))
    return schema.typed(protocol.with_step_counts(resolved, counts), config.arm)


def resolved_or_written(cfg: DictConfig) -> tuple[dict, ConfigError | None]:
    """The config resolved, or, where it does not resolve, as written (to record the point) with the ConfigError
    naming the key that failed."""
    try:
        return compose.resolve(cfg), None
    except ConfigError as error:
        return OmegaConf.to_container(cfg), error


def record_point(cfg: DictConfig, run_dir: Path, place: nodes.NodePlace, sweep_dir: Path | None = None) -> str:
    """Validate, run and record one point (node 0 records it), or, with sweep.resume=true, keep its earlier ok
    attempt, or, under sweep.stop_at, record it skipped where it could not finish in time going by the points of
    `sweep_dir` (None: a single run, nothing to go by); returns its status."""
    known, unresolved = resolved_or_written(cfg)
    if unresolved is None and resume.requested(known) and \
            resume.keeps_earlier_attempt(run_dir, lambda: checked_config(known, place)):
        return "ok"  # its earlier attempt's files stand, unchanged (harness/driver/resume.py)
    if place.primary:
        start_attempt(run_dir, cfg)
    config, error = None, unresolved
    try:
        if error is None:
            config = checked_config(known, place)
    except ConfigError as refused:  # a resolved value refused: it may have come from the environment
        error = compose.hide_interpolated(refused, cfg, known)
    finally:  # config.yaml, once: the point as it runs, or as written where it was refused or its check failed
        if place.primary:
            written = config.written if config is not None else known
            write_atomic(run_dir / runfiles.CONFIG, OmegaConf.to_yaml(written))
    if error is not None:
        console.error(f"config error: {error}")
        if place.primary:
            write_json(run_dir / runfiles.SUMMARY, build_summary(known, "config_error", str(error), [], 0.0, {}))
        return "config_error"
    too_late = stop_at.reason_to_skip(config.sweep.stop_at, run_dir, sweep_dir)
    if too_late is not None:  # not started: a later call of the sweep runs it (harness/driver/stop_at.py)
        console.error(f"skipped: {too_late}")
        if place.primary:
            write_json(run_dir / runfiles.SUMMARY, build_summary(config.written, "skipped", too_late, [], 0.0, {}))
        return "skipped"
    logs.setup(config.launcher.log_level)

    summary = run_point(config, run_dir, place)
    if not place.primary:
        return summary["status"]
    write_json(run_dir / runfiles.SUMMARY, summary)
    if config.logger.name == "wandb":
        mirror_point(run_dir, config, summary)
    console.phase_table(summary)
    if summary["status"] == "preempted" and stops.requeue_preempted(place, config.launcher.requeue):
        sys.exit(exits.REQUEUED)  # SLURM runs the job again; submitit waits for it instead of a result
    return summary["status"]


def mirror_point(run_dir: Path, config: schema.Config, summary: dict) -> None:
    """The point's W&B run; a failure of the mirror is one warning line (summary.json is the record and stands)."""
    try:
        env = json.loads((run_dir / runfiles.ENV).read_text())
        mirror_to_wandb(run_dir, config, read_jsonl(run_dir / runfiles.STEPS), summary, env)
    except Exception as error:  # W&B raises its own errors, pydantic's among them
        logger.warning(f"warning: the W&B mirror of {run_dir} failed: {traceback_last_line(error)}")


def start_attempt(run_dir: Path, cfg: DictConfig) -> None:
    """Set an earlier attempt in this run dir aside whole, then write this one's .hydra/ (what Hydra writes
    there itself unless hydra.output_subdir is null, as conf/hydra/default.yaml sets it: before the task runs,
    over the earlier attempt's copy)."""
    from hydra.core.hydra_config import HydraConfig

    earlier = runfiles.set_aside_previous_attempt(run_dir)
    if earlier is not None:
        logger.info(f"{run_dir} held an earlier attempt: its files are now in {earlier}")
    hydra_root = HydraConfig.instance().cfg
    (run_dir / runfiles.HYDRA_DIR).mkdir(exist_ok=True)
    for name, node in ((runfiles.HYDRA_CONFIG, cfg), (runfiles.HYDRA_SETTINGS, hydra_root),
                       (runfiles.OVERRIDES, hydra_root.hydra.overrides.task)):
        write_atomic(run_dir / name, OmegaConf.to_yaml(node))


def traceback_last_line(error: BaseException) -> str:
    """What a traceback's last line says (the first line of a message that spans several)."""
    return traceback.format_exception_only(error)[-1].strip().splitlines()[0]


def record_failure(cfg: DictConfig, run_dir: Path, place: nodes.NodePlace, status: str, reason: str) -> str:
    """Record a point that the driver could not finish, unless this attempt already has its summary (the console
    then says what summary.json says). Returns `status`, which decides what the driver does next. Never raises: a
    run dir it cannot write costs one line, and the sweep goes on."""
    summary_path = run_dir / runfiles.SUMMARY
    try:
        if summary_path.exists():
            recorded = json.loads(summary_path.read_text())["status"]
            console.error(f"status: {recorded} (recorded before the driver ended: {reason})")
            return status
        if place.primary and run_dir.is_dir():
            config = OmegaConf.to_container(cfg)  # unresolved: resolving may be what failed
            if not (run_dir / runfiles.CONFIG).exists():
                write_atomic(run_dir / runfiles.CONFIG, OmegaConf.to_yaml(cfg))
            rows = read_jsonl(run_dir / runfiles.STEPS)
            write_json(summary_path, build_summary(config, status, reason, rows, 0.0, {}))
    except Exception as error:
        logger.warning(f"warning: cannot record {run_dir}: {traceback_last_line(error)}")
    console.error(f"status: {status} ({reason})")
    return status


def stop_the_sweep(run_dir: Path, multirun: bool, status: str) -> None:
    """After a stop signal: the point is recorded; write the sweep's index (Hydra will not) and exit."""
    if multirun:
        SweepIndexCallback.write_running_index()
    console.error(f"{status}: the point's run files are in {run_dir}")
    sys.exit(exits.stopped_exit_code(status))


@hydra.main(version_base="1.3", config_path=str(REPO_ROOT / "conf"), config_name="config")
def hydra_app(cfg: DictConfig) -> str:
    return drive(cfg)


def check_command_line(args: list[str]) -> None:
    """What the driver refuses before Hydra starts, as one ConfigError: an unknown group option, then what Hydra
    itself would refuse (harness.config.compose.check_command_line). Nothing is run or written."""
    check_group_choices(args, REPO_ROOT)
    compose.check_command_line(args)


def main() -> None:
    """Console entry: refuse bad command lines in one line (unknown group options, what Hydra itself would refuse),
    then hand the command line to Hydra (or, with estimate_only=true, print the sweep's memory estimate without
    launching anything). A sweep's index is written however it ends, and its exit code says whether every point
    was recorded (harness/contract/exits.py)."""
    args = sys.argv[1:]
    signals.install()
    try:
        with signals.interruptible():
            if estimate.requested(args):
                check_group_choices(args, REPO_ROOT)
                multirun = "-m" in args or "--multirun" in args
                overrides = [a for a in args if a not in (estimate.ESTIMATE_ONLY, "-m", "--multirun")]
                compose.check_syntax(overrides)
                estimate.print_estimate(overrides, multirun)
                return
            check_command_line(args)
    except ConfigError as error:
        console.error(f"config error: {error}")
        sys.exit(CONFIG_ERROR_EXIT_CODE)
    except (KeyboardInterrupt, stops.Terminated) as stop:  # nothing started: nothing to record
        end_stopped("preempted" if isinstance(stop, stops.Terminated) else "interrupted")
    try:
        hydra_app()
    except (KeyboardInterrupt, stops.Terminated) as stop:  # between points: no point is running
        end_stopped("preempted" if isinstance(stop, stops.Terminated) else "interrupted")
    finally:  # Hydra ended the sweep with an error of its own: the index still lists what was recorded
        if SweepIndexCallback.running_sweep_dir is not None and SweepIndexCallback.outcome is None:
            SweepIndexCallback.write_running_index()
    if signals.received() is not None:  # a stop while Hydra's code ran, after the last point's start
        end_stopped(signals.status_of(signals.received()))
    sweep_code = SweepIndexCallback.exit_code()
    if sweep_code:
        sys.exit(sweep_code)


def end_stopped(status: str) -> None:
    """A stop signal while no point ran: the sweep's index lists what was recorded, and the driver exits."""
    SweepIndexCallback.write_running_index()
    console.error(status)
    sys.exit(exits.stopped_exit_code(status))


if __name__ == "__main__":
    main()
