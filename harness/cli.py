"""`harness SUBCOMMAND ...`: the console entry for the tools around the runs.

    harness report SWEEP_DIR [--out DIR]     tables, figures and executed notebooks of a sweep
    harness bench SWEEP_DIR [...]            the offload benchmark's ratios
    harness plan --profile P --budget-gb X   the offload planner on a saved profile (dry run)
    harness plan --out-of-sample SWEEP_DIR   each point planned from the other profiles of its shape
    harness archive SWEEP_DIR RESULTS_DIR    a sweep's small run files, for committing under results/

Runs themselves start with `python -m harness.run` (or `harness-run`), the Hydra app.
"""
from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {"report": "analysis.report", "bench": "analysis.bench", "plan": "harness.offload.plan_cli",
               "archive": "analysis.archive"}


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in SUBCOMMANDS:
        print(f"usage: harness {{{','.join(SUBCOMMANDS)}}} ...", file=sys.stderr)
        sys.exit(2)
    result = importlib.import_module(SUBCOMMANDS[args[0]]).main(args[1:])
    sys.exit(result if isinstance(result, int) else 0)


if __name__ == "__main__":
    main()
