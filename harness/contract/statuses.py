"""A point's status, as summary.json, index.jsonl, W&B and the report name it (README, "Statuses, hangs and Ctrl-C")."""

OK = "ok"
STATUSES = (OK, "oom", "died", "timeout", "preempted", "interrupted", "skipped", "config_error", "error")
