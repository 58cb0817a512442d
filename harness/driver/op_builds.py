"""How long a point spent building ops just in time: summary.json's `op_build_s`, which `sweep.stop_at` leaves out
of what a later point on the same machine will take (harness/driver/stop_at.py).

DeepSpeed builds its ops through torch's extension builder, one folder per op under the extensions folder
(buildlocks.extensions_root): torch writes the folder's build.ninja, then ninja links `<op>.so` in it. Torch writes
build.ninja on every load, built or not, and ninja relinks nothing that is up to date, so an op this point built is
one whose library was written after the launch, and its build took from the later of the launch and build.ninja's
writing to the library's. Measured from the files, the same for every rank and every way an op gets loaded.
"""
from __future__ import annotations

from pathlib import Path

from harness.driver.buildlocks import op_files

BUILD_FILE = "build.ninja"


def build_seconds(root: Path, since: float) -> float:
    """Seconds of op builds under the extensions folder `root` whose library was written at or after `since`
    (seconds since the epoch, the launch), summed; 0 where nothing was built."""
    total = 0.0
    for build_file in op_files(root, BUILD_FILE):
        library = build_file.parent / f"{build_file.parent.name}.so"
        try:
            started, built = build_file.stat().st_mtime, library.stat().st_mtime
        except OSError:  # not linked (a build that failed or was stopped), or removed meanwhile
            continue
        if built >= since:
            total += max(built - max(started, since), 0.0)
    return total
