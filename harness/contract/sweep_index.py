"""One entry of a sweep's index.jsonl: what the driver writes for each run dir (harness/driver/sinks.py) and the
synthetic fixtures write beside theirs, read through the one reader of run dirs."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.contract import reader, runfiles
from harness.contract.checks import lookup


def index_line(sweep_dir: Path, run_dir: Path) -> dict[str, Any] | None:
    """The sweep index entry of one run dir, or None when it has no summary yet. Its files come through the one
    reader of run dirs: MalformedFile (or OSError) for a summary it cannot read; a config without train.repeat (a
    refused point's, say) gives a null repeat."""
    summary_path = Path(run_dir) / runfiles.SUMMARY
    if not summary_path.exists():
        return None
    summary = reader.read_summary(summary_path)
    try:
        config = reader.read_config(Path(run_dir) / runfiles.CONFIG)
    except (OSError, reader.MalformedFile):
        config = {}
    final = summary.get("final") or {}
    return {
        "run_dir": str(Path(run_dir).relative_to(sweep_dir)),
        "overrides": reader.hydra_overrides(Path(run_dir)),
        "status": summary["status"], "reason": summary.get("reason"),
        "arm": summary.get("arm"), "model": summary.get("model"),
        "repeat": lookup(config, "train.repeat", None),
        "final": {"step_time_s_median": (final.get("step_time_s") or {}).get("median"),
                  "tokens_per_s_median": (final.get("tokens_per_s") or {}).get("median"),
                  "peak_reserved_bytes_max": (final.get("peak_reserved_bytes") or {}).get("max"),
                  "peak_allocated_bytes_max": (final.get("peak_allocated_bytes") or {}).get("max")},
    }
