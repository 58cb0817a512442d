"""`harness report SWEEP_DIR [--out DIR]`: execute the analysis notebooks on a sweep and write tables
(md, tex, csv), figures (pdf, png, plotted data as csv) and the executed notebooks."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from analysis.load import load_sweep

NOTEBOOK_DIR = Path(__file__).parent / "notebooks"
NOTEBOOKS = ("measurement", "throughput", "memory", "budget_sweep", "policies", "capacity")
PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the directory `import analysis` needs on the path


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="harness report", description=__doc__)
    parser.add_argument("sweep_dir", type=Path, metavar="SWEEP_DIR",
                        help="a multirun sweep dir (its index.jsonl and run dirs) or a single run dir")
    parser.add_argument("--out", type=Path, default=None, help="output dir (default: SWEEP_DIR/report)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status 0 when every notebook ran, 1 when one failed or no point could be read, 2 on bad usage."""
    args = parse_args(argv)
    if not args.sweep_dir.is_dir():
        print(f"error: {args.sweep_dir}: not a directory", file=sys.stderr)
        return 2
    out_dir = (args.out or args.sweep_dir / "report").resolve()
    sweep = load_sweep(args.sweep_dir)
    for problem in sweep.problems:
        print(problem.line(), file=sys.stderr)
    if sweep.points.empty:
        print(f"error: {args.sweep_dir}: no readable points", file=sys.stderr)
        return 1
    failed = [name for name in NOTEBOOKS if not run_notebook(name, args.sweep_dir.resolve(), out_dir)]
    print(f"report of {len(sweep.points)} point(s) from {args.sweep_dir}: {out_dir} (tables/, figures/, notebooks/)")
    if sweep.left_out:
        print(f"left out {len(sweep.left_out)} point(s): {', '.join(sweep.left_out)}")
    return 1 if failed else 0


def run_notebook(name: str, sweep_dir: Path, out_dir: Path) -> bool:
    """Execute one notebook with papermill in a kernel of this interpreter; False (and a line) if it fails. The
    kernel runs in an empty folder of its own, never in the output dir (a results folder, and what it holds, come
    from whoever ran the sweep): a pandas.py or a matplotlibrc there is never imported or honoured."""
    import jupytext
    import papermill
    import zmq
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    executed = out_dir / "notebooks" / f"{name}.ipynb"
    executed.parent.mkdir(parents=True, exist_ok=True)
    # No kernel dirs: jupyter_client falls back to ipykernel's own spec for sys.executable, so the kernel
    # is this interpreter whatever kernelspecs the machine has installed.
    kernel = KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
    if "transport_encryption" in kernel.trait_names() and zmq.has("curve"):
        kernel.transport_encryption = "auto"  # newer kernels warn about (and deserve) encrypted sockets
    try:
        with _importable_from_kernel(), tempfile.TemporaryDirectory(prefix="harness-kernel-") as kernel_dir:
            papermill.execute_notebook(
                jupytext.read(NOTEBOOK_DIR / f"{name}.py"), str(executed),
                parameters={"sweep_dir": str(sweep_dir), "out_dir": str(out_dir)},
                kernel_name="python3", km=kernel, progress_bar=False, cwd=kernel_dir)
    except papermill.PapermillExecutionError as error:
        print(f"error: notebook {name} failed: {error.ename}: {error.evalue} (see {executed})", file=sys.stderr)
        return False
    return True


@contextmanager
def _importable_from_kernel() -> Iterator[None]:
    """The kernel inherits this environment: its path is the package (even when it is not installed), then what
    PYTHONPATH held, then the interpreter's own; PYTHONSAFEPATH keeps the kernel's working folder off it."""
    before = {name: os.environ.get(name) for name in ("PYTHONPATH", "PYTHONSAFEPATH")}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), before["PYTHONPATH"]]))
    os.environ["PYTHONSAFEPATH"] = "1"
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


if __name__ == "__main__":
    sys.exit(main())
