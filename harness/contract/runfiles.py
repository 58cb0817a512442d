"""The files of a run dir: every name in one place, and one way to write them.

A reader (the driver, the stall watch, another node, the analysis) never sees half a file: each one is written
whole to a temp sibling and renamed over its name, except the two kinds that grow while a point runs
(steps.jsonl and the worker logs), which are appended to line by line. Every run file is created with one mode.
A new run file gets its name here, and a place in ATTEMPT_FILES when it belongs to one attempt at a point.
No Hydra here: the ranks use this module.
"""
from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import IO, Any, Callable, Union

import yaml

RUN_FILE_MODE = 0o644  # narrowed by the umask, as for any new file

CONFIG = "config.yaml"                      # the resolved config: the driver writes it, the ranks read it
HYDRA_DIR = ".hydra"                        # what Hydra records of the point
HYDRA_CONFIG = f"{HYDRA_DIR}/config.yaml"
HYDRA_SETTINGS = f"{HYDRA_DIR}/hydra.yaml"
OVERRIDES = f"{HYDRA_DIR}/overrides.yaml"   # the point's overrides, in full
ENV = "env.json"
DIFF = "git.diff"                           # `git diff HEAD` where the tree differed from its commit (envinfo)
STEPS = "steps.jsonl"
SUMMARY = "summary.json"
WORKER = "worker.json"                      # what the ranks saw
LOG = "worker.log"                          # node 0's ranks' output
PROFILE = "profile.json"                    # arm=offload: the memory profile the plan was made from
ARCHIVED_PROFILE = "profile.json.gz"        # the same, gzip-compressed, in a committed campaign (harness archive)
PLAN = "plan.json"
TORCH_TRACE = "torch_trace.json"            # debug.profile_step
TORCH_OPS = "torch_ops.txt"
MEMORY_SNAPSHOT = "memory_snapshot.pickle"  # debug.memory_trace_step
MEMORY_TRACE = "memory_trace.json"
PROFILED_STEP = "profiled_step.json"        # a committed campaign's torch_trace.json, summed (harness archive)
WANDB_DIR = "wandb"
RANK_ERRORS = "error.rank*.json"            # glob patterns of rank_error and node_failure
NODE_FAILURES = "node*.failed.json"
ATTEMPTS_DIR = "attempts"                   # earlier attempts at the point, attempts/N/
INDEX = "index.jsonl"                       # in the sweep dir: one line per point
MULTIRUN = "multirun.yaml"                  # in the sweep dir: Hydra writes it before the sweep's first point

# The files of one attempt at a point; a requeued or re-run point sets them aside before it starts again.
ATTEMPT_FILES = (CONFIG, HYDRA_DIR, STEPS, SUMMARY, WORKER, ENV, LOG, PROFILE, PLAN, WANDB_DIR, RANK_ERRORS,
                 NODE_FAILURES, TORCH_TRACE, TORCH_OPS, MEMORY_SNAPSHOT, MEMORY_TRACE)


def profile_file(run_dir: str | Path) -> Path | None:
    """A point's profile: as its rank wrote it, or as a committed campaign keeps it; None where it has neither."""
    for name in (PROFILE, ARCHIVED_PROFILE):
        if (Path(run_dir) / name).is_file():
            return Path(run_dir) / name
    return None


def rank_error(rank: int) -> str:
    """A failed rank's error file, which the driver classifies the point by."""
    return f"error.rank{rank}.json"


def node_log(node_rank: int) -> str:
    """Node 0 keeps worker.log; other nodes write their own file (appends from two hosts would tear)."""
    return LOG if node_rank == 0 else f"worker.node{node_rank}.log"


def node_failure(node_rank: int) -> str:
    """Written by a node whose torchrun failed, so the point's other nodes stop at once."""
    return f"node{node_rank}.failed.json"


UNNUMBERED = 1 << 30  # job_order's number for a folder that is not a point's


def job_order(run_dir: str | Path) -> tuple[int, str]:
    """Hydra names run dirs '<job num>_<overrides>': order by job number, not by text (others last)."""
    name = Path(run_dir).name
    head = name.split("_", 1)[0]
    return (int(head) if head.isdigit() else UNNUMBERED, name)


# --- writing ---------------------------------------------------------------------------------------------

Content = Union[str, bytes, Callable[[Path], None]]


def write_atomic(path: str | Path, content: Content) -> None:
    """Write a run file whole or not at all: into a temp sibling created with RUN_FILE_MODE, then renamed over
    `path`. `content` is the text, the bytes, or a function that fills the temp file given its path (for writers
    that open the file themselves, such as torch's trace export; the file keeps the mode it was created with)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, RUN_FILE_MODE))
    try:
        if callable(content):
            content(tmp)
        else:
            tmp.write_bytes(content.encode() if isinstance(content, str) else content)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # left only when filling it failed


def digest(value: Any) -> str:
    """A short, stable name for a JSON-able value (its keys sorted): the profile cache's key, a run's profiled
    graphs. Two values share it only when equal."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:20]


def write_json(path: str | Path, obj: Any) -> None:
    """A JSON run file: sorted keys, indented, newline-terminated."""
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def open_append(path: str | Path) -> IO[str]:
    """A run file that grows line by line while the point runs (a crash keeps every line written)."""
    return open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, RUN_FILE_MODE), "a")


class StepWriter:
    """Rank 0's steps.jsonl: one row per optimizer step, flushed at once so a crash keeps every step."""

    def __init__(self, run_dir: Path):
        self._file = open_append(Path(run_dir) / STEPS)

    def write(self, row: dict) -> None:
        self._file.write(json.dumps(row, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


# --- reading ---------------------------------------------------------------------------------------------

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


def read_config(run_dir: Path) -> dict[str, Any]:
    """The point's resolved config.yaml as plain data (the driver resolved it: no interpolations remain)."""
    return yaml.safe_load((Path(run_dir) / CONFIG).read_text())


# --- attempts ----------------------------------------------------------------------------------------------

def set_aside_previous_attempt(run_dir: Path) -> Path | None:
    """Move an earlier attempt's files (a requeued or re-run point) to attempts/N/, whole (its config and
    .hydra/ too), so this attempt starts with an empty steps.jsonl; returns where they went."""
    run_dir = Path(run_dir)
    found = [p for pattern in ATTEMPT_FILES for p in run_dir.glob(pattern)]
    if not found:
        return None
    attempts = run_dir / ATTEMPTS_DIR
    taken = [int(p.name) for p in attempts.glob("*") if p.name.isdigit()] if attempts.exists() else []
    target = attempts / str(max(taken, default=-1) + 1)  # after the last one, whatever was deleted before it
    target.mkdir(parents=True)
    for path in found:
        path.rename(target / path.name)
    return target
