"""The Hydra launcher of `launcher=slurm` (Hydra knows it as hydra_plugins.harness_launcher.SlurmLauncher):
hydra-submitit-launcher's jobs, submitted and waited for by the harness.

Each point is hydra-submitit-launcher's own job (its launcher object called in the job, a job array per sweep).
What differs:
- the jobs are submitted `--requeue` or `--no-requeue` as `launcher.requeue` says (SLURM requeues a batch job by
  default: `scontrol requeue`, a node failure or a preemption would otherwise run a recorded point again);
- the wait for a job ends when SLURM says the job ended, result or not (submitit waits for ever where `sacct`
  has no answer, and fails the whole sweep, index unwritten, for a job without a result): a job that ends
  without one (cancelled while pending, killed past its time limit, lost with its node) is recorded with a status
  from SLURM's state for it, and the sweep goes on to its index.
"""
from __future__ import annotations

import socket
import time
from abc import abstractmethod
from pathlib import Path
from typing import Any, Mapping, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher
from omegaconf import OmegaConf, open_dict

from harness.contract import runfiles
from harness.cluster import stops
from harness.cluster.nodes import NodePlace

RESULT_POLL_S = 1.0    # how often the job's result file is looked for
STATE_POLL_S = 5.0     # how often SLURM is asked whether the job ended (one scontrol call)
RESULT_GRACE_S = 15.0  # after SLURM says a job that ran ended: how long its result may take to show (a shared disk)
# SLURM's job states before a job has ended for good (a requeued job is pending again).
UNENDED_STATES = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "COMPLETING", "CONFIGURING",
                  "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
# SLURM lists an ended job for MinJobAge (300 s by default), far longer than a poll, but an array task cancelled
# while pending leaves no record at all (sacct has none either).
FORGOTTEN = "no longer listed by SLURM"
# The status of a point whose job ended without a result, by SLURM's final state for the job (else `died`).
STATUS_OF_ENDED_JOB = {"CANCELLED": "preempted", "PREEMPTED": "preempted", FORGOTTEN: "preempted",
                       "TIMEOUT": "timeout", "DEADLINE": "timeout"}


def with_requeue(params: dict[str, Any], requeue: bool) -> dict[str, Any]:
    """`params` with the sbatch flag for launcher.requeue among its additional parameters."""
    flag = {"requeue": True} if requeue else {"no-requeue": True}
    return {**params, "additional_parameters": {**(params.get("additional_parameters") or {}), **flag}}


def executor_parameters(launcher_params: Mapping[str, Any], requeue: bool) -> dict[str, Any]:
    """hydra.launcher's keys as submitit's AutoExecutor takes them (SLURM-only keys prefixed `slurm_`), with
    the requeue flag among the sbatch parameters."""
    shared = set(OmegaConf.structured(BaseQueueConf).keys())
    params = with_requeue({key: value for key, value in launcher_params.items()
                           if key not in ("submitit_folder", "max_num_timeout")}, requeue)
    return {key if key in shared else f"slurm_{key}": value for key, value in params.items()}


class SlurmLauncher(SubmititSlurmLauncher):
    """hydra-submitit-launcher's SLURM launcher with the requeue policy and the bounded wait described above. A point
    whose job left no result is recorded by `record_failure`, the driver's own, which the class Hydra instantiates
    hands in (hydra_plugins/harness_launcher): the cluster side never imports the driver."""

    @abstractmethod
    def record_failure(self, cfg, run_dir: Path, place: NodePlace, status: str, reason: str) -> str:
        """Record a point the driver could not finish (harness.driver.app.record_failure); returns `status`."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        executor = submitit.AutoExecutor(folder=self.params["submitit_folder"], cluster="slurm",
                                         slurm_max_num_timeout=self.params["max_num_timeout"])
        executor.update_parameters(**executor_parameters(self.params, bool(self.config.launcher.requeue)))
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        calls = [(list(overrides), "hydra.sweep.dir", initial_job_idx + k, f"job_id_for_{initial_job_idx + k}",
                  Singleton.get_state()) for k, overrides in enumerate(job_overrides)]
        jobs = executor.map_array(self, *zip(*calls))
        return [self.job_return(job, overrides, job_num) for job, (overrides, _, job_num, *_) in zip(jobs, calls)]

    def job_return(self, job, overrides: list[str], job_num: int) -> JobReturn:
        """What the point's job returned, once it ended; for a job without a result, the status it is recorded with."""
        from submitit.core.utils import pickle_load

        first_task = job.task(0)  # node 0's driver records the point
        ended_as = wait_for_job(first_task.paths, job.job_id)
        if ended_as is None:
            outcome, value = pickle_load(first_task.paths.result_pickle)
            if outcome == "success":
                return value
            status, reason = "error", last_line(value)  # the job raised outside the driver, which records its own
        else:
            status = STATUS_OF_ENDED_JOB.get(ended_as, "died")
            reason = f"SLURM job {job.job_id} ended without a result ({ended_as})"
        self.record(overrides, job_num, status, reason)
        done = JobReturn(overrides=overrides, status=JobStatus.COMPLETED)
        done.return_value = status
        return done

    def record(self, overrides: list[str], job_num: int, status: str, reason: str) -> None:
        """Record a point whose job left no result, in its run dir (made here if the job never ran), unless its
        driver recorded this attempt already."""
        sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(sweep_config.hydra.job):
            sweep_config.hydra.job.num = job_num
        run_dir = Path(str(sweep_config.hydra.sweep.dir)) / str(sweep_config.hydra.sweep.subdir)
        run_dir.mkdir(parents=True, exist_ok=True)
        if not (run_dir / runfiles.OVERRIDES).exists():  # the job never ran: the index reads them from here
            (run_dir / runfiles.HYDRA_DIR).mkdir(exist_ok=True)
            runfiles.write_atomic(run_dir / runfiles.OVERRIDES, OmegaConf.to_yaml(overrides))
        task_config = OmegaConf.masked_copy(sweep_config, [key for key in sweep_config if key != "hydra"])
        self.record_failure(task_config, run_dir, NodePlace(0, 1, (socket.gethostname(),)), status, reason)


def wait_for_job(paths, job_id: str) -> str | None:
    """Wait until the job's task (submitit's JobPaths) has a result file (None), or SLURM has said for
    RESULT_GRACE_S that the job ended and no result came, or at once for a job that never started (no log):
    then SLURM's state for it. A job SLURM puts back in the queue meanwhile is waited for again."""
    ended_as, ended_at, next_ask = None, 0.0, 0.0
    while not paths.result_pickle.exists():
        now = time.monotonic()
        if now >= next_ask:
            state, next_ask = ended_state(job_id), now + STATE_POLL_S
            ended_at = now if ended_as is None else ended_at
            ended_as = state
        if ended_as is not None and (now - ended_at >= RESULT_GRACE_S or not paths.stdout.exists()):
            return ended_as
        time.sleep(RESULT_POLL_S)
    return None


def ended_state(job_id: str) -> str | None:
    """SLURM's final state for an ended job; None while it has not ended, or SLURM cannot be asked."""
    fields = stops.slurm_job_fields(job_id)
    if fields is None:
        return None
    state = fields.get("JobState", FORGOTTEN)
    return None if state in UNENDED_STATES else state


def last_line(traceback_text: str) -> str:
    lines = [line.strip() for line in traceback_text.splitlines() if line.strip()]
    return lines[-1] if lines else "no traceback"
