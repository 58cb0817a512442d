"""What every report notebook starts with: the sweep's run files read (one warning line per unreadable file)
and one place to write its tables and figures (OUT_DIR/tables, OUT_DIR/figures, and the per-run panels that
diagnose a run rather than make a claim in OUT_DIR/figures/diagnostics)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis.load import Sweep, load_sweep
from analysis.plots import Plot, save_plot
from analysis.render import write_table
from analysis.tables import Table

FIGURES = "figures"
DIAGNOSTICS = "diagnostics"  # under FIGURES


@dataclass
class NotebookReport:
    sweep: Sweep
    out_dir: Path

    @property
    def points(self) -> pd.DataFrame:
        return self.sweep.points

    @property
    def steps(self) -> pd.DataFrame:
        return self.sweep.steps

    def table(self, table: Table) -> pd.DataFrame:
        """Write the table's files; its display frame, for the notebook to show."""
        write_table(table, self.out_dir / "tables")
        return table.display

    def figure(self, plot: Plot) -> list[Path]:
        return save_plot(plot, self.out_dir / FIGURES)

    def diagnostic(self, plot: Plot) -> list[Path]:
        return save_plot(plot, self.out_dir / FIGURES / DIAGNOSTICS)


def open_report(sweep_dir: str | Path, out_dir: str | Path) -> NotebookReport:
    sweep = load_sweep(sweep_dir)
    print(sweep.problem_report() or "every run file read")
    return NotebookReport(sweep, Path(out_dir))
