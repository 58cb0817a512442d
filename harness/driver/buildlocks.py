"""Build locks that nobody will release. DeepSpeed builds its ops just in time, through torch's extension builder,
into the torch extensions folder (TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions/<python>_<cuda>/), one
folder per op; a build holds `<op>/lock` while it runs and every other build of the op waits for the file to go. A
build killed mid-way leaves it behind, and every later point on the machine then waits on it forever, printing
nothing, before step 0.

So before a point's launch, and after its processes have ended however they ended (a stop, a timeout), the driver
removes each lock that no build is running for, with one warning line naming it. A build is running when a process
of this machine works in the op's folder (torch runs ninja, and ninja the compilers, there). The extensions folder
is taken to be this machine's: where home folders are shared between nodes, set TORCH_EXTENSIONS_DIR to a folder
of the node's own.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Mapping

import psutil

LOCK = "lock"
logger = logging.getLogger(__name__)


def extensions_root(environ: Mapping[str, str]) -> Path:
    """Where the ranks build their ops: TORCH_EXTENSIONS_DIR, else torch's default under the user's cache folder."""
    if environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(environ["TORCH_EXTENSIONS_DIR"])
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "torch_extensions"


def op_files(root: Path, name: str) -> list[Path]:
    """The files called `name` in the op folders of the extensions folder: <root>/<op>/ (TORCH_EXTENSIONS_DIR) or
    <root>/<py_cu>/<op>/ (torch's default)."""
    if not root.is_dir():
        return []
    return sorted([*root.glob(f"*/{name}"), *root.glob(f"*/*/{name}")])


def build_locks(root: Path) -> list[Path]:
    """The locks under the extensions folder, one per op whose build holds it (or left it)."""
    return op_files(root, LOCK)


def building(op_dir: Path) -> bool:
    """Whether a process of this machine works in the op's folder (its cwd there, or an argument naming it)."""
    op_dir = op_dir.resolve()
    for process in psutil.process_iter(["cwd", "cmdline"]):
        cwd, cmdline = process.info.get("cwd"), process.info.get("cmdline") or []
        if cwd and Path(cwd).is_relative_to(op_dir):
            return True
        if any(str(op_dir) in argument for argument in cmdline):
            return True
    return False


def clear_stale_locks(environ: Mapping[str, str] = os.environ) -> list[Path]:
    """Remove every build lock of the extensions folder that no running build holds, one warning line each; the
    locks removed."""
    removed = []
    for lock in build_locks(extensions_root(environ)):
        if building(lock.parent):
            continue
        try:
            lock.unlink()
        except FileNotFoundError:  # its build ended meanwhile
            continue
        except OSError as error:
            logger.warning(f"warning: cannot remove the stale build lock {lock} ({error.strerror}): a point that "
                           "builds this op will wait on it until launcher.startup_timeout_s")
            continue
        logger.warning(f"warning: removed the stale build lock {lock} (no build of it runs; a build killed "
                       "mid-way left it, and every build of the op would wait on it forever)")
        removed.append(lock)
    return removed
