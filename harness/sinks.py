"""Where results go: steps.jsonl and summary.json (the source of truth), the W&B mirror, the sweep index."""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

STEPS_FILE, SUMMARY_FILE, INDEX_FILE = "steps.jsonl", "summary.json", "index.jsonl"


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON so a reader never sees half a file (write a sibling temp file, then rename). The temp file is
    opened like any other run file (not mkstemp's 0600), so every run file gets the same mode."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "x") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSONL file; a torn last line (a worker killed mid-write) is dropped."""
    rows = []
    if not Path(path).exists():
        return rows
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


class StepWriter:
    """Rank 0's steps.jsonl: one row per optimizer step, flushed at once so a crash keeps every step."""

    def __init__(self, run_dir: Path):
        self._file = open(Path(run_dir) / STEPS_FILE, "a")

    def write(self, row: dict) -> None:
        self._file.write(json.dumps(row, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def flat_summary(summary: dict) -> dict[str, Any]:
    """summary.json as flat W&B summary keys: `final/step_time_s/median`, `phase1/...`, `status`."""
    flat: dict[str, Any] = {"status": summary["status"], "reason": summary["reason"],
                            "steps_completed": summary["steps_completed"]}
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

    summary_path = Path(run_dir) / SUMMARY_FILE
    if not summary_path.exists():
        return None
    summary = json.loads(summary_path.read_text())
    overrides_path = Path(run_dir) / ".hydra" / "overrides.yaml"
    overrides = yaml.safe_load(overrides_path.read_text()) if overrides_path.exists() else []
    config = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
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
    path = sweep_dir / INDEX_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))
    os.replace(tmp, path)
    return path


def iter_run_dirs(sweep_dir: Path) -> list[Path]:
    """Run dirs of a sweep (those with a summary), in Hydra job order."""
    return sorted((p.parent for p in Path(sweep_dir).glob(f"*/{SUMMARY_FILE}")), key=job_order)


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
