# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Budget sweep
# The offload arms against their memory budget: step time (IQR bars) with the bytes offloaded per step on
# a second axis, and peak reserved memory against the budget line. Non-offload arms are drawn as
# horizontal references.

# %% tags=["parameters"]
sweep_dir = "analysis/fixtures/sweep"  # a multirun dir: multirun/<sweep.name>/<timestamp>
out_dir = "report"

# %%
from pathlib import Path

from analysis import plots
from analysis.load import load_sweep
from analysis.render import write_table
from analysis.tables import budget_table

sweep = load_sweep(sweep_dir)
print(sweep.problem_report() or "every run file read")
tables_dir, figures_dir = Path(out_dir) / "tables", Path(out_dir) / "figures"

# %%
table = budget_table(sweep.points)
write_table(table, tables_dir)
table.display

# %%
plot = plots.step_time_vs_budget(sweep.points)
plots.save_plot(plot, figures_dir);

# %%
plot = plots.peak_reserved_vs_budget(sweep.points)
plots.save_plot(plot, figures_dir);
