"""The driver's console: the lines a person running the harness reads (the point's status and phase table, a
refused config, where a stopped point's files are, a point a resumed sweep kept). Everything else the harness says
goes through its logger (harness/contract/logs.py)."""
from __future__ import annotations

import sys

from harness.contract.units import GB


def error(line: str) -> None:
    """A line for the user on stderr: a refused config, a point's final status."""
    print(line, file=sys.stderr)


def out(line: str) -> None:
    """A line for the user on stdout: a table, an estimate."""
    print(line)


def phase_table(summary: dict) -> None:
    """The point's status and, per phase, its step counts, compile time, median step time with its interval,
    throughput and peak reserved memory; then what makes the measurement suspect."""
    print(f"status: {summary['status']}" + (f" ({summary['reason']})" if summary["reason"] else ""))
    if not summary["phases"]:
        return
    print(f"{'phase':>5} {'steps':>5} {'n':>3} {'compile s':>9} {'median s':>9} {'95% interval':>17} {'p25 s':>8}"
          f" {'p75 s':>8} {'tok/s':>10} {'peak resv GB':>12}")
    for p in summary["phases"]:
        t, tok, resv = p["step_time_s"], p["tokens_per_s"]["median"], p["peak_reserved_bytes"]["max"]
        fmt = lambda v, w, d: f"{v:>{w}.{d}f}" if v is not None else f"{'-':>{w}}"  # noqa: E731
        interval = f"[{t['ci95_low']:.4f}, {t['ci95_high']:.4f}]" if t["ci95_low"] is not None else "-"
        print(f"{p['phase']:>5} {p['first_step']:>2}-{p['last_step']:<2} {p['n']:>3} {fmt(p['compile_time_s'], 9, 3)}"
              f" {fmt(t['median'], 9, 4)} {interval:>17} {fmt(t['p25'], 8, 4)} {fmt(t['p75'], 8, 4)}"
              f" {fmt(tok, 10, 0)} {fmt(resv and resv / GB, 12, 2)}")
    for note in [*(summary["steady_reasons"] if summary["steady"] is not None else []),
                 *((summary["machine"] or {}).get("flags") or [])]:
        print(f"flag: {note}")
