"""Where a point's results go beyond its run dir: the W&B mirror and the sweep's index."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from harness import runfiles


def flat_summary(summary: dict) -> dict[str, Any]:
    """summary.json as flat W&B summary keys: `final/step_time_s/median`, `phase1/...`, `status`, `steady` and why
    not, the machine's flags."""
    flat: dict[str, Any] = {"status": summary["status"], "reason": summary["reason"],
                            "steps_completed": summary["steps_completed"], "steady": summary.get("steady"),
                            "steady_reasons": summary.get("steady_reasons") or [],
                            "machine_flags": (summary.get("machine") or {}).get("flags") or []}
    blocks = [(f"phase{p['phase']}", p) for p in summary["phases"]]
    if summary.get("final"):
        blocks.append(("final", summary["final"]))
    for prefix, block in blocks:
        for key, value in block.items():
            if isinstance(value, dict):
                for stat, number in value.items():
                    flat[f"{prefix}/{key}/{stat}"] = number
            elif key not in ("phase",):
                flat[f"{prefix}/{key}"] = value
    return flat


def mirror_to_wandb(run_dir: Path, logger_cfg: dict, config: dict, rows: list[dict], summary: dict,
                    env: dict, group: str) -> dict[str, Any]:
    """One W&B run per point, from the driver: config, step history, summary, env.

    Returns the summary W&B holds for the run, read back from the run object, so callers can check it.
    """
    import wandb

    run = wandb.init(mode=logger_cfg.get("mode", "offline"), project=logger_cfg.get("project"),
                     entity=logger_cfg.get("entity"), dir=str(run_dir), group=group,
                     job_type=config["arm"]["name"], name=Path(run_dir).name, config=config,
                     reinit="finish_previous")
    try:
        for row in rows:
            run.log({k: v for k, v in row.items() if k != "step" and v is not None}, step=row["step"])
        run.summary.update(flat_summary(summary))
        run.summary.update({f"env/{k}": v for k, v in env.items() if not isinstance(v, (list, dict))})
        return {k: run.summary[k] for k in run.summary.keys()}
    finally:
        run.finish()


def index_line(sweep_dir: Path, run_dir: Path) -> dict[str, Any] | None:
    """The sweep index entry of one run dir, or None when it has no summary yet."""
    import yaml

    summary_path = Path(run_dir) / runfiles.SUMMARY
    if not summary_path.exists():
        return None
    summary = json.loads(summary_path.read_text())
    overrides_path = Path(run_dir) / runfiles.OVERRIDES
    overrides = yaml.safe_load(overrides_path.read_text()) if overrides_path.exists() else []
    config = runfiles.read_config(run_dir)
    final = summary.get("final") or {}
    return {
        "run_dir": str(Path(run_dir).relative_to(sweep_dir)),
        "overrides": overrides,
        "status": summary["status"], "reason": summary["reason"],
        "arm": summary.get("arm"), "model": summary.get("model"),
        "repeat": config["train"]["repeat"],
        "final": {"step_time_s_median": (final.get("step_time_s") or {}).get("median"),
                  "tokens_per_s_median": (final.get("tokens_per_s") or {}).get("median"),
                  "peak_reserved_bytes_max": (final.get("peak_reserved_bytes") or {}).get("max"),
                  "peak_allocated_bytes_max": (final.get("peak_allocated_bytes") or {}).get("max")},
    }


def write_sweep_index(sweep_dir: Path) -> Path:
    """(Re)build index.jsonl from every run dir under a sweep dir: one line per point, in job order."""
    sweep_dir = Path(sweep_dir)
    lines = [line for d in iter_run_dirs(sweep_dir) if (line := index_line(sweep_dir, d)) is not None]
    path = sweep_dir / runfiles.INDEX
    runfiles.write_atomic(path, "".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))
    return path


def iter_run_dirs(sweep_dir: Path) -> list[Path]:
    """Run dirs of a sweep (those with a summary), in Hydra job order."""
    return sorted((p.parent for p in Path(sweep_dir).glob(f"*/{runfiles.SUMMARY}")), key=job_order)


def job_order(run_dir: str | Path) -> tuple[int, str]:
    """Hydra names run dirs '<job num>_<overrides>': order by job number, not by text (others last)."""
    name = Path(run_dir).name
    head = name.split("_", 1)[0]
    return (int(head) if head.isdigit() else 1 << 30, name)


class SweepIndexCallback(Callback):
    """Writes the sweep dir's index.jsonl when a multirun ends (also after failed points), or through
    write_running_index when Ctrl-C ends it early (Hydra calls no callback then)."""

    running_sweep_dir: Path | None = None  # the sweep dir of the multirun in this process

    def on_multirun_start(self, config, **kwargs) -> None:
        SweepIndexCallback.running_sweep_dir = Path(config.hydra.sweep.dir)

    def on_multirun_end(self, config, **kwargs) -> None:
        SweepIndexCallback.running_sweep_dir = Path(config.hydra.sweep.dir)
        SweepIndexCallback.write_running_index()

    @staticmethod
    def write_running_index() -> None:
        sweep_dir = SweepIndexCallback.running_sweep_dir
        if sweep_dir is not None and sweep_dir.exists():
            path = write_sweep_index(sweep_dir)
            print(f"sweep index: {path} ({sum(1 for _ in open(path))} points)")
