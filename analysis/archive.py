"""`harness archive SWEEP_DIR RESULTS_DIR`: the run files of a sweep that a committed campaign keeps, copied into
results/<campaign>/sweep/ (then `harness report` makes its report from them, and CI rebuilds it from the same files).

Kept, per point: what the tables read and what names the code that ran (KEPT), each at most MAX_FILE_BYTES, the
profile gzip-compressed (profile.json.gz, ~14x smaller: results hold small files, and the readers inflate it); never
the worker logs, W&B folders, compile caches, earlier attempts or the allocator's pickled snapshot. A profiled step's
Chrome trace (torch_trace.json, megabytes) is kept as what the tables read of it: its seconds by where they went
(profiled_step.json, harness/contract/profiled_step.py), which the reader takes where the trace is absent. The
sweep's index lines come along, so a later archive into the same folder (a campaign run in parts, or repeats folded
into it) adds its points beside the earlier ones; a point the index does not list (a single run set beside the sweep,
e.g. a cold run) keeps Hydra's overrides.yaml instead, which is where the reader finds its overrides. A point already
there is refused, never overwritten. A point with no summary.json (one a call's end killed) or one `sweep.stop_at`
kept from starting holds no result and is left out, named on stderr: a resumed sweep runs it, archived later.
Every file is read as a run file is (harness/contract/safe_read.py): nothing outside the sweep dir, nothing but
regular files.

    harness archive multirun/retry_causes/run1 results/retry_causes/sweep
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import sys
from pathlib import Path
from typing import Sequence

from harness.contract import reader, runfiles, safe_read, statuses
from harness.contract.profiled_step import read_profiled_step

KEPT = (runfiles.CONFIG, runfiles.ENV, runfiles.WORKER, runfiles.SUMMARY, runfiles.STEPS, runfiles.PROFILE,
        runfiles.ARCHIVED_PROFILE, runfiles.PLAN, runfiles.DIFF, runfiles.MEMORY_TRACE)
MAX_FILE_BYTES = 8 * 2**20  # results hold small files; the largest kept today is a profile.json of ~0.5 MB


class ArchiveError(Exception):
    """Why nothing was archived: one line."""


def archive(sweep_dir: Path, out_dir: Path) -> tuple[list[str], list[str]]:
    """Copy the sweep's kept files into out_dir (its run dirs and index lines); returns the run dirs archived and
    those left out because they hold no summary.json (a point its call's end killed: no result, run it again).
    ArchiveError, before anything is written, where a point is already in out_dir or a kept file cannot be read."""
    problems: list[reader.Problem] = []
    listed = reader.read_index(sweep_dir, problems)
    found = [name for name in reader.run_dirs(sweep_dir, listed, problems)
             if name != "." and (sweep_dir / name).is_dir()]
    if problems:
        raise ArchiveError(problems[0].line())
    names = [name for name in found if holds_a_result(sweep_dir, name)]
    if not names:
        raise ArchiveError(f"{sweep_dir}: no finished points (run dirs with a summary.json)")
    taken = [name for name in names if (out_dir / name).exists()]
    if taken:
        raise ArchiveError(f"{out_dir / taken[0]}: already archived (a point is never overwritten)")
    points = {name: point_files(sweep_dir, name, indexed=name in listed) for name in names}
    for name, files in points.items():
        for file_name, text in files.items():
            stored_name, data = stored(file_name, text)
            (out_dir / name / stored_name).parent.mkdir(parents=True, exist_ok=True)
            (out_dir / name / stored_name).write_bytes(data)
    append_index(sweep_dir, out_dir, names)
    return names, [name for name in found if name not in names]


def holds_a_result(sweep_dir: Path, name: str) -> bool:
    """A point with a summary.json, unless sweep.stop_at kept it from starting: a resumed sweep runs that one, and
    it could then not be archived beside a skipped copy of itself."""
    try:
        summary = safe_read.read_json(sweep_dir / name / runfiles.SUMMARY, sweep_dir)
    except FileNotFoundError:
        return False
    except (OSError, ValueError) as error:
        raise ArchiveError(f"{sweep_dir / name / runfiles.SUMMARY}: {error}") from None
    return not (isinstance(summary, dict) and statuses.never_started(summary))


def point_files(sweep_dir: Path, name: str, indexed: bool = True) -> dict[str, str]:
    """file name -> text of one point's kept files, with profiled_step.json made from its trace; a point the index
    does not list keeps its overrides file too (the index holds the others')."""
    run_dir = sweep_dir / name
    files = {}
    for file_name in KEPT if indexed else (*KEPT, runfiles.OVERRIDES):
        try:
            files[file_name] = safe_read.read_text(run_dir / file_name, sweep_dir, MAX_FILE_BYTES)
        except FileNotFoundError:
            continue
        except (OSError, safe_read.RefusedFile) as error:
            raise ArchiveError(f"{run_dir / file_name}: {error}") from None
    try:
        step = read_profiled_step(run_dir / runfiles.TORCH_TRACE, sweep_dir)
    except (OSError, ValueError) as error:  # RefusedFile and NotAProfiledStep are ValueErrors
        raise ArchiveError(f"{run_dir / runfiles.TORCH_TRACE}: {error}") from None
    if step is not None:
        files[runfiles.PROFILED_STEP] = json.dumps(dataclasses.asdict(step), indent=1) + "\n"
    return files


def stored(file_name: str, text: str) -> tuple[str, bytes]:
    """The name and bytes a kept file is committed as: the profile (the largest, mostly node names repeated)
    gzip-compressed, with no time stamp so the same profile is the same bytes; every other file as it was."""
    if file_name in (runfiles.PROFILE, runfiles.ARCHIVED_PROFILE):
        return runfiles.ARCHIVED_PROFILE, gzip.compress(text.encode(), mtime=0)
    return file_name, text.encode()


def append_index(sweep_dir: Path, out_dir: Path, names: list[str]) -> None:
    """The sweep's index lines of the archived points, after those out_dir's index already holds (a point the
    driver never indexed gets none, as in its sweep)."""
    try:
        lines = safe_read.read_text(sweep_dir / runfiles.INDEX, sweep_dir).splitlines()
    except FileNotFoundError:
        return
    archived = set(names)
    kept = [line for line in lines if line.strip() and _run_dir(line) in archived]
    with open(out_dir / runfiles.INDEX, "a") as index:
        index.writelines(line + "\n" for line in kept)


def _run_dir(index_line: str) -> str | None:
    """The run dir an index line names (read_index has refused the sweep's unreadable lines already)."""
    entry = safe_read.parse_json(index_line, runfiles.INDEX)
    return entry.get("run_dir") if isinstance(entry, dict) else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness archive", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path, help="a sweep dir (multirun/NAME/STAMP)")
    parser.add_argument("out_dir", type=Path, help="where the campaign's run files go (results/NAME/sweep)")
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        print(f"error: {args.sweep_dir}: not a directory", file=sys.stderr)
        return 2
    try:
        names, unfinished = archive(args.sweep_dir, args.out_dir)
    except ArchiveError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for name in unfinished:
        print(f"left out {args.sweep_dir / name}: no result (unfinished, or skipped by sweep.stop_at: resume the sweep"
              f" to run it)", file=sys.stderr)
    print(f"archived {len(names)} point(s) into {args.out_dir}; next: harness report {args.out_dir} "
          f"--out {args.out_dir.parent / 'report'}")
    return 0
