"""`harness plan` (also `python -m harness.offload.plan`): the offload planner on a saved profile, a dry run that
prints the plan our pass would make as JSON."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import NoReturn

from harness.contract.checks import LARGEST_MAGNITUDE, is_usable_number
from harness.contract.errors import ConfigError
from harness.contract.units import GB
from harness.offload import out_of_sample
from harness.offload.plan import (BUDGET_RULES, DEFAULT_BUDGET_RULE, RELEASE_POLICIES, RELOAD_POLICIES, Plan,
                                  device_limit_bytes, plan_offload)
from harness.offload.profile import byte_count, expect, load_profile, missing_readings


class _OneLineParser(argparse.ArgumentParser):
    """Usage errors as one stderr line, exit 2, like ConfigErrors."""

    def error(self, message: str) -> NoReturn:
        cut = message if len(message) <= 200 else message[:197] + "..."  # argparse quotes a bad value whole
        self.exit(2, f"{self.prog}: {cut}\n")


def _gb_to_bytes(value: float, key: str) -> int:
    expect(is_usable_number(value) and value >= 0, key,
           f"must be a finite number >= 0 and at most {LARGEST_MAGNITUDE:g}, got {value:g}")
    return int(value * GB)


def _budget_from_args(args: argparse.Namespace) -> int:
    if args.budget_bytes is not None:
        return byte_count(args.budget_bytes, "offload.budget_bytes")
    return _gb_to_bytes(args.budget_gb, "offload.budget_gb")


def _plan_from_args(args: argparse.Namespace, profile: dict, missing: tuple[str, ...]) -> Plan:
    """The plan the pass would make; on a profile without the step model's readings (`missing`) only a budget
    sized as DeepSpeed's pass sizes it (placed on the profile as read), without a predicted peak or feasibility."""
    has_budget = args.budget_gb is not None or args.budget_bytes is not None
    sized_as_deepspeed = has_budget and args.budget_rule == "deepspeed"
    expect(sized_as_deepspeed or not missing, "profile",
           f"{args.profile} has no {' or '.join(missing)} (recorded before the step model): the device rule and "
           "--budget-rule step_model plan by the peak it predicts; plan a budget sized as DeepSpeed's pass "
           "(--budget-gb)")
    expect(not sized_as_deepspeed or args.device_gb is None, "device_gb",
           "with a budget it applies to --budget-rule step_model only")
    expect(sized_as_deepspeed or args.peak_cap_gb is None, "offload.peak_cap_gb",
           "applies to a budget under --budget-rule deepspeed only")
    limit = None if args.device_gb is None else device_limit_bytes(
        _gb_to_bytes(args.device_gb, "device_gb"), profile.get("allocator_overhead_bytes"))
    cap = None if args.peak_cap_gb is None else _gb_to_bytes(args.peak_cap_gb, "offload.peak_cap_gb")
    plan = plan_offload(profile, _budget_from_args(args) if has_budget else None, limit, args.budget_rule,
                        args.reload, args.release, cap)
    return dataclasses.replace(plan, predicted_peak_bytes=None, feasible=None) if missing else plan


def main(argv: list[str] | None = None) -> int:
    parser = _OneLineParser(prog="python -m harness.offload.plan",
                            description="Print the offload plan for a memory profile and a budget as JSON.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--profile", help="profile.json of one rank (or a committed campaign's profile.json.gz)")
    source.add_argument("--out-of-sample", type=Path, metavar="SWEEP_DIR",
                        help="plan every point of our pass in the sweep again from each other profile.json of its "
                             "model and shape, as the point ran, and print the predicted against the measured peaks "
                             "as JSON (out_of_sample.py)")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--budget-gb", type=float, help="device memory budget in GB (1e9 bytes)")
    budget.add_argument("--budget-bytes", type=int, help="device memory budget in bytes")
    parser.add_argument("--device-gb", type=float,
                        help="device size in GB: the least offload predicted to fit it, less the allocator overhead "
                             "the profile's run measured (the auto rule at a device limit; with a budget, "
                             "--budget-rule step_model fits the lesser of the two)")
    parser.add_argument("--budget-rule", default=DEFAULT_BUDGET_RULE,
                        help=f"how a budget is planned: {' | '.join(BUDGET_RULES)} (default {DEFAULT_BUDGET_RULE}, "
                             "as offload.budget_rule)")
    parser.add_argument("--reload", default="asap", help=f"reload policy: {' | '.join(RELOAD_POLICIES)}")
    parser.add_argument("--release", default="recorded", help=f"release policy: {' | '.join(RELEASE_POLICIES)}")
    parser.add_argument("--peak-cap-gb", type=float, default=None,
                        help="cap (GB) that releases and asap reloads are placed under; default: the budget")
    args = parser.parse_args(argv)
    if args.out_of_sample is not None:
        return _out_of_sample(parser, args)
    if args.budget_gb is None and args.budget_bytes is None and args.device_gb is None:
        parser.error("one of --budget-gb, --budget-bytes, --device-gb is required")
    try:
        profile = load_profile(args.profile)
        missing = missing_readings(profile)
        plan = _plan_from_args(args, profile, missing)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    if missing:
        print(f"warning: {args.profile} has no {' or '.join(missing)} (recorded before the step model): placed as "
              "DeepSpeed's pass places it; peak and feasibility not predicted (null)", file=sys.stderr)
    print(plan.to_json())
    return 0


def _out_of_sample(parser: _OneLineParser, args: argparse.Namespace) -> int:
    """Each point planned as it ran: no budget, device or policy flags beside it."""
    given = [flag for flag, value, default in (
        ("--budget-gb", args.budget_gb, None), ("--budget-bytes", args.budget_bytes, None),
        ("--device-gb", args.device_gb, None), ("--peak-cap-gb", args.peak_cap_gb, None),
        ("--budget-rule", args.budget_rule, DEFAULT_BUDGET_RULE), ("--reload", args.reload, "asap"),
        ("--release", args.release, "recorded")) if value != default]
    if given:
        parser.error(f"--out-of-sample plans each point as it ran; drop {', '.join(given)}")
    if not args.out_of_sample.is_dir():
        parser.error(f"--out-of-sample: {args.out_of_sample}: not a directory")
    print(out_of_sample.pairs_json(out_of_sample.pairs(args.out_of_sample, warn=_warn)))
    return 0


def _warn(line: str) -> None:
    print(line, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
