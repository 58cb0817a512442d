"""Run files read by someone who did not write them: `harness bench`, the report (analysis.load and its notebooks)
and the sweep index all read a sweep dir through this one reader, which
- never imports a module because a file names it: an arm's class is looked up among the known ones
  (harness/contract/arm_targets.py), and a run dir naming another is read as an unknown arm, with one warning;
- never follows a path out of the sweep dir: an index entry or a run dir that leads elsewhere is refused, and each
  run file is opened only as harness.contract.safe_read allows (a regular file inside the sweep dir once its links
  are resolved, of a bounded size, JSON and YAML of a bounded depth and without aliases);
- leaves out a point whose config.yaml holds a value of the wrong type for its key (a string or a list where a
  number belongs, an integer too large to compute with), with one warning naming the file and the key;
- turns each bad file into one Problem naming it and reads on: a point without a readable config.yaml or
  summary.json is left out, a bad env.json, plan.json or bad steps.jsonl lines only cost those columns or rows.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.contract import arm_targets, runfiles, safe_read
from harness.contract.checks import is_finite_number, lookup
from harness.contract.config_types import ArmClassOf, wrong_types
from harness.contract.profiled_step import ProfiledStep, read_profiled_step, read_profiled_sums
from harness.contract.retry_trace import RetryTrace, read_retry_trace
from harness.contract.statuses import STATUSES

STEP_FIELDS = ("step", "phase", "phase_step", "step_time_s")  # a steps.jsonl line without these is unreadable
# What made our pass's plan (plan.json's `rule`): a budget as DeepSpeed sizes it, the step model within a budget, or
# the device rule without one. Plans from before the device rule name no rule.
PLAN_RULES = ("budget", "step_model", "device_limit")
SUMMARY_NUMBERS = ("world_size", "steps_completed", "wall_time_s", "startup_s", "op_build_s", "budget_bytes",
                   "planned_offload_bytes", "predicted_peak_bytes", "device_memory_bytes", "over_budget_bytes")


@dataclass(frozen=True)
class Problem:
    """One unreadable run file; `point` is the run dir left out, or None if the point stays."""

    file: str
    message: str
    point: str | None = None

    def line(self) -> str:
        left_out = "; point left out" if self.point is not None else ""
        return f"warning: {self.file}: {self.message}{left_out}"


class MalformedFile(ValueError):
    """A run file that exists but does not follow the run-file contract: args (file, message)."""


@dataclass(frozen=True)
class RunFiles:
    """One point's run files, read and checked."""
    run_dir: str  # relative to the sweep dir ('.' for a single run dir)
    overrides: list[str]
    config: Mapping[str, Any]
    summary: Mapping[str, Any]
    env: Mapping[str, Any] | None
    steps: list[dict]
    plan: PlanFacts | None = None  # our pass's plan.json, where the point planned
    retry_trace: RetryTrace | None = None  # memory_trace.json's retries, where a step was traced
    profiled_step: ProfiledStep | None = None  # torch_trace.json's time by where it went, where a step was profiled


@dataclass(frozen=True)
class PlanFacts:
    """What plan.json says of the plan that ran (its last phase's): the rule that made it (None: a plan from
    before plans named one) and the budget it planned against, in bytes (the device rule's own, not the one the
    driver resolved)."""
    rule: str | None
    budget_bytes: int | None


@dataclass
class SweepFiles:
    points: list[RunFiles]
    overrides: dict[str, list[str]]  # of every run dir found, read or left out
    problems: list[Problem] = field(default_factory=list)


def read_sweep(sweep_dir: str | Path, arm_class_of: ArmClassOf | None = None) -> SweepFiles:
    """Every point of one sweep dir (its index.jsonl and its run dirs), or of a single run dir. `arm_class_of`
    (harness.arms.known_class, from a caller above the contract) lets the type check read the arm's own knobs."""
    sweep_dir = Path(sweep_dir)
    problems: list[Problem] = []
    listed = read_index(sweep_dir, problems)
    overrides = {run_dir: listed[run_dir] if run_dir in listed
                 else hydra_overrides(sweep_dir / run_dir, problems, root=sweep_dir)
                 for run_dir in run_dirs(sweep_dir, listed, problems)}
    points = [point for run_dir, point_overrides in overrides.items()
              if (point := read_point(sweep_dir, run_dir, point_overrides, problems, arm_class_of)) is not None]
    return SweepFiles(points, overrides, problems)


def read_point(sweep_dir: Path, run_dir: str, overrides: list[str], problems: list[Problem],
               arm_class_of: ArmClassOf | None = None) -> RunFiles | None:
    path = sweep_dir / run_dir
    try:
        config = read_config(path / runfiles.CONFIG, root=sweep_dir)
        summary = read_summary(path / runfiles.SUMMARY, root=sweep_dir)
    except (OSError, MalformedFile) as error:
        problems.append(Problem(_problem_file(error), _describe(error), point=str(path)))
        return None
    wrong = wrong_types(config, arm_class_of)
    if wrong:  # the tables group and compute by these keys: a point they cannot read is left out whole
        problems.append(Problem(str(path / runfiles.CONFIG), "; ".join(wrong), point=str(path)))
        return None
    unknown_arm = arm_problem(config, path / runfiles.CONFIG)
    if unknown_arm is not None:
        problems.append(unknown_arm)
    env = read_env(path / runfiles.ENV, problems, root=sweep_dir)
    steps = read_steps(path / runfiles.STEPS, summary.get("steps_completed"), problems, root=sweep_dir)
    plan = read_plan(path / runfiles.PLAN, problems, root=sweep_dir)
    return RunFiles(run_dir, overrides, config, summary, env, steps, plan,
                    read_recorded(read_retry_trace, path / runfiles.MEMORY_TRACE, problems, sweep_dir, "retry causes"),
                    read_profiled(path, problems, sweep_dir))


def read_profiled(path: Path, problems: list[Problem], root: Path) -> ProfiledStep | None:
    """The profiled step of a run dir: from its trace, or, in a committed campaign, from the sums kept instead."""
    if (path / runfiles.TORCH_TRACE).exists():
        return read_recorded(read_profiled_step, path / runfiles.TORCH_TRACE, problems, root, "profiled-step columns")
    return read_recorded(read_profiled_sums, path / runfiles.PROFILED_STEP, problems, root, "profiled-step columns")


def read_recorded(read: Callable[[Path, Path | None], safe_read.Facts | None], recorded_file: Path,
                  problems: list[Problem], root: Path | None, columns: str) -> safe_read.Facts | None:
    """What a debug recorder's file says (`read`: retry_trace.read_retry_trace, profiled_step.read_profiled_step);
    None without the file or, with one line naming it and the `columns` left empty, for a file that is not one."""
    try:
        return read(recorded_file, root)
    except safe_read.RefusedFile as error:
        problems.append(Problem(error.file, f"{error.message}; {columns} left empty"))
    except (OSError, ValueError) as error:  # not JSON, or not what `read` reads
        problems.append(Problem(str(recorded_file), f"{error}; {columns} left empty"))
    return None


# --- where the points are --------------------------------------------------------------------------------

def inside(sweep_dir: Path, run_dir: str) -> bool:
    """Whether a run dir named relative to the sweep dir stays inside it (links followed)."""
    if Path(run_dir).is_absolute():
        return False
    return (sweep_dir / run_dir).resolve().is_relative_to(sweep_dir.resolve())


def read_index(sweep_dir: Path, problems: list[Problem]) -> dict[str, list[str]]:
    """run_dir -> overrides; the index may repeat a point (driver append + end-of-sweep callback). An entry whose
    run_dir leaves the sweep dir is refused."""
    index_file = sweep_dir / runfiles.INDEX
    try:
        text = safe_read.read_text(index_file, sweep_dir)
    except FileNotFoundError:
        return {}
    except (OSError, safe_read.RefusedFile) as error:
        problems.append(Problem(str(index_file), _describe(error)))
        return {}
    listed: dict[str, list[str]] = {}
    bad_lines, outside = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = safe_read.parse_json(line, index_file)
            run_dir, overrides = entry["run_dir"], [str(o) for o in entry.get("overrides") or []]
            if not isinstance(run_dir, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            bad_lines.append(number)
            continue
        if not inside(sweep_dir, run_dir):
            outside.append(number)
            continue
        listed[run_dir] = overrides
    if bad_lines:
        problems.append(Problem(str(index_file), f"unreadable line(s) {_numbers(bad_lines)}"))
    if outside:
        problems.append(Problem(str(index_file), f"line(s) {_numbers(outside)} name a run_dir outside the sweep "
                                "dir; ignored"))
    return listed


def _numbers(numbers: list[int]) -> str:
    return ", ".join(str(number) for number in numbers)


def run_dirs(sweep_dir: Path, listed: Mapping[str, list[str]], problems: list[Problem]) -> list[str]:
    """Run dirs named in the index plus those on disk (a point whose driver died never reached the index); a folder
    that links out of the sweep dir is refused."""
    if (sweep_dir / runfiles.CONFIG).is_file() or (sweep_dir / runfiles.SUMMARY).is_file():
        return ["."]
    on_disk = [
        child.name for child in sorted(sweep_dir.iterdir())
        if child.is_dir() and ((child / runfiles.CONFIG).exists() or (child / runfiles.SUMMARY).exists())
    ] if sweep_dir.is_dir() else []
    for name in [name for name in on_disk if not inside(sweep_dir, name)]:
        problems.append(Problem(str(sweep_dir / name), "leads out of the sweep dir; ignored"))
        on_disk.remove(name)
    return list(dict.fromkeys([*listed, *on_disk]))


def hydra_overrides(path: Path, problems: list[Problem] | None = None, root: Path | None = None) -> list[str]:
    """Overrides of a point missing from the index, from Hydra's own record when it is there (a file safe_read
    refuses is one Problem in `problems`)."""
    overrides_file = path / runfiles.OVERRIDES
    try:
        overrides = safe_read.read_yaml(overrides_file, root if root is not None else path)
    except safe_read.RefusedFile as error:
        if problems is not None:
            problems.append(Problem(error.file, error.message))
        return []
    except (OSError, ValueError, yaml.YAMLError):
        return []
    return [str(override) for override in overrides] if isinstance(overrides, list) else []


# --- each file -------------------------------------------------------------------------------------------

def _problem_file(error: Exception) -> str:
    return str(error.filename) if isinstance(error, OSError) else str(error.args[0])


def _describe(error: Exception) -> str:
    if isinstance(error, FileNotFoundError):
        return "missing"
    if isinstance(error, OSError):
        return f"unreadable ({error.strerror})"
    return str(error.args[1])


def read_config(config_file: Path, root: Path | None = None) -> Mapping[str, Any]:
    """config.yaml, opened as safe_read allows inside `root` (default: its run dir); MalformedFile naming it."""
    try:
        config = safe_read.read_yaml(config_file, root)
    except safe_read.RefusedFile as error:
        raise MalformedFile(error.file, error.message) from None
    except (ValueError, yaml.YAMLError) as error:
        raise MalformedFile(str(config_file), f"not valid YAML ({type(error).__name__})") from error
    if not isinstance(config, Mapping) or not isinstance(lookup(config, "arm.name", None), str) \
            or not isinstance(lookup(config, "model.name", None), str):
        raise MalformedFile(str(config_file), "not a resolved config (needs arm.name and model.name)")
    return config


def read_summary(summary_file: Path, root: Path | None = None) -> Mapping[str, Any]:
    try:
        summary = safe_read.read_json(summary_file, root)
    except safe_read.RefusedFile as error:
        raise MalformedFile(error.file, error.message) from None
    except ValueError as error:
        raise MalformedFile(str(summary_file), "not valid JSON") from error
    if not isinstance(summary, Mapping) or summary.get("status") not in STATUSES:
        raise MalformedFile(str(summary_file), f"needs a status, one of {', '.join(STATUSES)}")
    phases, final = summary.get("phases") or [], summary.get("final")
    if not isinstance(phases, list) or not all(isinstance(phase, Mapping) for phase in phases) \
            or not (final is None or isinstance(final, Mapping)):
        raise MalformedFile(str(summary_file), "phases must be a list of objects and final an object or null")
    blocks = [*phases, *([final] if final else []), {key: summary.get(key) for key in SUMMARY_NUMBERS}]
    if not all(_numbers_only(block) for block in blocks):
        raise MalformedFile(str(summary_file), f"phases, final and {', '.join(SUMMARY_NUMBERS)} must hold numbers")
    return summary


def _is_number_or_null(value: Any) -> bool:
    """null, true/false, any float (NaN too: a diverged loss is a result), or an int a float holds (the analysis
    computes in floats: a larger one would raise there)."""
    if value is None or isinstance(value, (bool, float)):
        return True
    return isinstance(value, int) and is_finite_number(value)


def _numbers_only(block: Mapping[str, Any]) -> bool:
    """A stats block: numbers or null, lists of numbers (the steps it measured), or objects of numbers or null
    (median, p25, ...)."""
    return all(_is_number_or_null(value) or (isinstance(value, list) and all(map(_is_number_or_null, value)))
               or (isinstance(value, Mapping) and all(map(_is_number_or_null, value.values())))
               for value in block.values())


def read_env(env_file: Path, problems: list[Problem], root: Path | None = None) -> Mapping[str, Any] | None:
    try:
        env = safe_read.read_json(env_file, root)
        if not isinstance(env, Mapping):
            raise ValueError
    except FileNotFoundError:
        problems.append(Problem(str(env_file), "missing; env columns left empty"))
        return None
    except safe_read.RefusedFile as error:
        problems.append(Problem(error.file, f"{error.message}; env columns left empty"))
        return None
    except (OSError, ValueError):
        problems.append(Problem(str(env_file), "not a JSON object; env columns left empty"))
        return None
    return env


def read_plan(plan_file: Path, problems: list[Problem], root: Path | None = None) -> PlanFacts | None:
    """The rule and budget of plan.json (one plan, or plans keyed by phase number: the last phase's); None without
    the file (an arm that does not plan, a point that failed before planning) or, with one line naming it, when it
    is not a plan: a rule outside PLAN_RULES, a budget that is no whole number of bytes."""
    try:
        plan = safe_read.read_json(plan_file, root)
    except FileNotFoundError:
        return None
    except safe_read.RefusedFile as error:
        problems.append(Problem(error.file, f"{error.message}; plan columns left empty"))
        return None
    except (OSError, ValueError):
        problems.append(Problem(str(plan_file), "not JSON; plan columns left empty"))
        return None
    if isinstance(plan, Mapping) and plan and all(key.isdigit() for key in plan):
        plan = plan[max(plan, key=int)]
    rule, budget = (plan.get("rule"), plan.get("budget_bytes")) if isinstance(plan, Mapping) else (None, None)
    if not isinstance(plan, Mapping) or not (rule is None or rule in PLAN_RULES) \
            or not (budget is None or (isinstance(budget, int) and not isinstance(budget, bool) and budget >= 0)):
        problems.append(Problem(str(plan_file), f"not a plan (rule one of {', '.join(PLAN_RULES)} or none, "
                                "budget_bytes a whole number); plan columns left empty"))
        return None
    return PlanFacts(rule, budget)


def is_step_row(record: Any) -> bool:
    """A steps.jsonl row: step, phase and phase_step counts, a step time, and numbers, true/false or null else."""
    if not isinstance(record, dict) or any(name not in record for name in STEP_FIELDS):
        return False
    counts = (record["step"], record["phase"], record["phase_step"])
    if not all(isinstance(count, int) and not isinstance(count, bool) and count >= 0 for count in counts):
        return False
    if not (is_finite_number(record["step_time_s"]) and record["step_time_s"] >= 0):
        return False
    return all(_is_number_or_null(value) for value in record.values())


def read_steps(steps_file: Path, steps_completed: Any, problems: list[Problem],
               root: Path | None = None) -> list[dict]:
    """The rows of steps.jsonl; a line that is no step row (torn, not JSON, wrong types, nested too deep) is
    skipped, and the file named once."""
    try:
        lines = safe_read.read_text(steps_file, root).splitlines()
    except safe_read.RefusedFile as error:
        problems.append(Problem(error.file, f"{error.message}; no per-step series for this point"))
        return []
    except FileNotFoundError:
        if steps_completed:
            problems.append(Problem(str(steps_file), "missing; no per-step series for this point"))
        return []
    except OSError as error:
        problems.append(Problem(str(steps_file), f"unreadable ({error.strerror}); no per-step series for this point"))
        return []
    records, bad_lines = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = safe_read.parse_json(line, steps_file)
        except ValueError:  # safe_read.RefusedFile too
            record = None
        if is_step_row(record):
            records.append(record)
        else:
            bad_lines.append(number)
    if bad_lines:
        problems.append(Problem(str(steps_file), f"unreadable line(s) {_numbers(bad_lines)} skipped"))
    return records


def arm_problem(config: Mapping[str, Any], config_file: Path) -> Problem | None:
    """One warning for a run dir whose arm.`_target_` names a class this checkout does not know: it is read as an
    unknown arm (its name kept as a label), and nothing it names is imported."""
    arm = config.get("arm")
    if not isinstance(arm, Mapping) or not arm.get(arm_targets.TARGET):
        return None
    target = str(arm[arm_targets.TARGET])
    if arm_targets.is_known(target):
        return None
    return Problem(str(config_file), f"{arm_targets.unknown_target(target).message}; read as an unknown arm")
