"""env.json: what produced a run (code version, library versions, GPUs, allocator settings)."""
from __future__ import annotations

import importlib.metadata
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


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


def collect_env(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch

    gpu_name, driver = _nvidia_smi()
    status = _git("status", "--porcelain")
    launcher = cfg["launcher"]
    return {
        "git_sha": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "deepspeed": _version("deepspeed"),
        "transformers": _version("transformers"),
        "cuda": torch.version.cuda,
        "driver": driver,
        "gpu_name": gpu_name,
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "world_size": launcher["nproc_per_node"] * launcher.get("nnodes", 1),
        "hostnames": [socket.gethostname()],
        "pytorch_cuda_alloc_conf": cfg["env"]["pytorch_cuda_alloc_conf"],
        "reserved_cap_gb": cfg["env"]["reserved_cap_gb"],
        "device_memory_gb": cfg["env"].get("device_memory_gb"),
    }
