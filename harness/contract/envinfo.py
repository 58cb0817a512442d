"""env.json: what produced a run (code version, library versions, GPUs, allocator settings).

The code is named by its commit (`git_sha`) and, where the tree differed from it, by what differed
(`git_dirty_files`): the tracked files modified against HEAD, and the untracked files where a run's code and configs
live (RUN_SOURCES: a new module imported, a new experiment composed, though never committed). `git_diff_sha256` is the
SHA-256 of the diff that turns the commit into that tree: `git diff HEAD --binary`, then each such untracked file as
a new file, whose text the driver keeps beside env.json (runfiles.DIFF). Ignored files never count, nor untracked
ones elsewhere (notes, a wheel folder), nor the run's own outputs where the run dir lies in the repository, nor the
committed campaigns under results/: earlier runs' outputs, which no run reads (a campaign archived since the last
commit once made a 22 MB diff of run files, past what a committed point may keep)."""
from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

from harness.contract.schema.config import Config

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN_SOURCES = ("harness", "conf", "experiments")  # where an untracked file can change what a run does
OUTPUTS = ("results",)  # committed campaigns: what runs wrote, never what a run reads


def _git(*args: str, strip: bool = True, ok_codes: tuple[int, ...] = (0,)) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode not in ok_codes:
        return None
    return out.stdout.strip() if strip else out.stdout


def git_state(run_dir: Path | None = None) -> tuple[dict[str, Any], str | None]:
    """(env.json's git keys, the diff text or None where the tree matched its commit); the run dir's own files are
    left out where it lies in the repository. Without git (or outside a checkout) every value is None."""
    exclude = [f":(exclude){folder}" for folder in OUTPUTS]
    if run_dir is not None and Path(run_dir).resolve().is_relative_to(REPO_ROOT):
        exclude.append(f":(exclude){Path(run_dir).resolve().relative_to(REPO_ROOT)}")
    names = _git("diff", "HEAD", "--name-only", "--", ".", *exclude)
    untracked = _git("ls-files", "--others", "--exclude-standard", "--", *RUN_SOURCES, *exclude)
    if names is None or untracked is None:
        names = untracked = None
    added = untracked.splitlines() if untracked else []
    dirty = (names.splitlines() if names else []) + added
    diff = None
    if dirty:
        diff = (_git("diff", "HEAD", "--binary", "--", ".", *exclude, strip=False) if names else "") + \
            "".join(_new_file_diff(path) for path in added)
    return {
        "git_sha": _git("rev-parse", "HEAD"),
        "git_dirty": bool(dirty) if names is not None else None,
        "git_dirty_files": dirty if names is not None else None,
        "git_diff_sha256": hashlib.sha256(diff.encode()).hexdigest() if diff else None,
    }, diff


def _new_file_diff(path: str) -> str:
    """An untracked file as a diff that creates it (git's own format; exit code 1 means the files differ)."""
    return _git("diff", "--no-index", "--binary", "--", "/dev/null", path, strip=False, ok_codes=(0, 1)) or ""


def boot_id() -> str | None:
    """This machine's boot (Linux's random boot id; None elsewhere): what its points share that a fresh machine's
    do not, such as the JIT-built ops a first point leaves behind (sweep.stop_at reads it)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _nvidia_smi() -> tuple[str | None, str | None]:
    """(GPU name, driver version) without creating a CUDA context in the driver process."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    first = out.stdout.strip().splitlines()[:1]
    if out.returncode != 0 or not first:
        return None, None
    name, _, driver = first[0].partition(",")
    return name.strip(), driver.strip()


def collect_env(config: Config, run_dir: Path | None = None) -> tuple[dict[str, Any], str | None]:
    """(env.json's contents, the diff to keep beside it, or None: git_state)."""
    import torch

    gpu_name, driver = _nvidia_smi()
    git, diff = git_state(run_dir)
    return {
        **git,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "deepspeed": _version("deepspeed"),
        "transformers": _version("transformers"),
        "cuda": torch.version.cuda,
        "driver": driver,
        "gpu_name": gpu_name,
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "world_size": config.world_size,
        "hostnames": [socket.gethostname()],
        "boot_id": boot_id(),
        "pytorch_cuda_alloc_conf": config.env.pytorch_cuda_alloc_conf,
        "reserved_cap_gb": config.env.reserved_cap_gb,
        "device_memory_gb": config.env.device_memory_gb,
    }, diff
