"""A point's status, as summary.json, index.jsonl, W&B and the report name it (README, "Statuses, hangs and Ctrl-C")."""

OK = "ok"
SKIPPED = "skipped"  # kept from starting (sweep.stop_at): no wall time, no result
STATUSES = (OK, "oom", "died", "timeout", "preempted", "interrupted", SKIPPED, "config_error", "error")
# The reason of a point `sweep.stop_at` kept from starting (harness/driver/stop_at.py): skipped, no result.
STOP_AT_REASON = "sweep.stop_at:"


def never_started(summary: dict) -> bool:
    """Whether a summary records a point sweep.stop_at kept from starting (a resumed sweep runs it)."""
    return summary.get("status") == SKIPPED and str(summary.get("reason") or "").startswith(STOP_AT_REASON)
