"""`sweep.resume=true`: a point whose run dir already holds a finished, `ok` attempt at the same point, made by the
same code on the same kind of machine, is kept instead of run again, so a campaign longer than one call of its
command goes on where the last call stopped (the same command, the same hydra.sweep.dir).

What is compared, and why each:
- summary.json's `status` must be `ok`: any other status, or no summary (a call killed mid-point), runs again.
- config.yaml against the config this attempt would write (validated, its step counts settled: what the driver
  writes), key by key. Only keys that cannot change what an `ok` point measured may differ (CHANGEABLE): the
  watchdogs' timeouts (an ok point ended before any of them), the log level (lines printed), sweep.stop_at (when a
  call ends), and sweep.resume and sweep.strict themselves (the exit code). Every other key counts, the logger too:
  a kept point has only the W&B run its own attempt made.
- env.json against this checkout and machine (harness/contract/envinfo.py), key by key over SAME_ENV: the commit
  and the hash of the uncommitted diff name the code; the library versions and the GPU model and count name what
  it ran on, since a point measured on another GPU or torch is no repeat of this one. Hostnames may differ (a
  fresh machine of the same kind). Where git names no commit (no checkout), nothing tells two versions apart,
  so the point runs again.
Anything that cannot be read or checked runs again: the attempt that runs then records what went wrong.
The verdict comes before the attempt starts, so nothing is set aside unless the point runs; its config is checked
for the verdict only where the earlier attempt ended ok, and again, as always, when the point runs. Every node of a
multi-node point reads the same files and reaches the same verdict.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml
from omegaconf import OmegaConf

from harness.contract import runfiles, safe_read, schema
from harness.contract.checks import lookup
from harness.contract.envinfo import collect_env
from harness.driver import console

logger = logging.getLogger(__name__)

KEPT = "ok, same config and code"
CHANGEABLE = frozenset({"launcher.timeout_s", "launcher.stall_timeout_s", "launcher.startup_timeout_s",
                        "launcher.dist_timeout_min", "launcher.log_level", "sweep.resume", "sweep.strict",
                        "sweep.stop_at"})
SAME_ENV = ("git_sha", "git_diff_sha256", "python", "torch", "deepspeed", "transformers", "cuda", "driver",
            "gpu_name", "gpu_count")


@dataclass(frozen=True)
class Verdict:
    """Whether the earlier attempt stands for this one; `why` says so, or why the point runs again (None where the
    run dir held no attempt)."""
    kept: bool
    why: str | None


def requested(resolved: Mapping[str, Any]) -> bool:
    """sweep.resume of the resolved config (false where it is absent or no bool: the checks refuse it later)."""
    return lookup(resolved, "sweep.resume", False) is True


def keeps_earlier_attempt(run_dir: Path, settle: Callable[[], schema.Config]) -> bool:
    """Judge run_dir's earlier attempt (`settle`: this attempt's checked config) and say what came of it: one
    console line for a kept point, a log line for one that runs again."""
    verdict = judge(run_dir, settle)
    if verdict.kept:
        console.out(f"kept: {run_dir} ({verdict.why})")
    elif verdict.why:
        logger.info(f"resume: {run_dir} runs again: {verdict.why}")
    return verdict.kept


def judge(run_dir: Path, settle: Callable[[], schema.Config]) -> Verdict:
    """The verdict on run_dir's earlier attempt against this one (the module's docstring says what is compared)."""
    status = recorded(run_dir, runfiles.SUMMARY, safe_read.read_json, "status")
    if status is None:
        held = (run_dir / runfiles.CONFIG).exists()
        return Verdict(False, "its earlier attempt left no readable summary" if held else None)
    if status != "ok":
        return Verdict(False, f"its earlier attempt ended {status}")
    try:
        config = settle()
    except Exception as error:  # the attempt that runs fails the same way and records it
        return Verdict(False, f"its config does not check ({type(error).__name__})")
    differs = config_difference(recorded(run_dir, runfiles.CONFIG, safe_read.read_yaml), as_written(config))
    if differs:
        return Verdict(False, f"its config differs at {differs}")
    differs = env_difference(recorded(run_dir, runfiles.ENV, safe_read.read_json), collect_env(config, run_dir)[0])
    if differs:
        return Verdict(False, f"it ran with another {differs}")
    return Verdict(True, KEPT)


def recorded(run_dir: Path, name: str, read: Callable[[Path, Path], Any], key: str | None = None) -> Any:
    """A run file of a run dir (or its `key`): an earlier attempt's, or a sibling point's; read by safe_read's rules;
    None where it cannot be."""
    try:
        content = read(run_dir / name, run_dir)
    except (OSError, ValueError):  # missing, refused (safe_read.RefusedFile) or unparsable
        return None
    if key is None:
        return content
    return content.get(key) if isinstance(content, dict) else None


def as_written(config: schema.Config) -> Any:
    """The config as config.yaml would hold it, read back: the same YAML the driver writes, so both sides compare
    as YAML reads them."""
    return yaml.safe_load(OmegaConf.to_yaml(dict(config.written)))


def config_difference(earlier: Any, now: Any) -> str | None:
    """The first dotted key (in sorted order) whose value differs, CHANGEABLE left out; None where all agree.
    An earlier config that is no mapping differs at its root."""
    if not isinstance(earlier, dict) or not isinstance(now, dict):
        return runfiles.CONFIG
    flat_earlier, flat_now = _leaves(earlier), _leaves(now)
    keys = sorted((set(flat_earlier) | set(flat_now)) - CHANGEABLE)
    return next((key for key in keys if flat_earlier.get(key, _ABSENT) != flat_now.get(key, _ABSENT)), None)


_ABSENT = object()  # a key one side lacks differs from any value, null included


def _leaves(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every leaf of a nested mapping by its dotted key (a list is one leaf)."""
    leaves: dict[str, Any] = {}
    for name, value in tree.items():
        key = f"{prefix}{name}"
        leaves.update(_leaves(value, f"{key}.") if isinstance(value, dict) and value else {key: value})
    return leaves


def env_difference(earlier: Any, now: Mapping[str, Any]) -> str | None:
    """The first SAME_ENV key whose value differs, or why none can tell (git names no commit); None where they
    all agree."""
    if not isinstance(earlier, dict):
        return runfiles.ENV
    if now.get("git_sha") is None:
        return "checkout: git names no commit here"
    return next((f"{key} ({earlier.get(key)!r}, now {now.get(key)!r})" for key in SAME_ENV
                 if earlier.get(key) != now.get(key)), None)
