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
# # Memory
# Peak allocated and reserved memory per phase (GiB), bytes offloaded and reloaded per step, allocator
# retries; peak reserved memory step by step, where growth after a phase boundary shows.

# %% tags=["parameters"]
sweep_dir = "analysis/fixtures/sweep"  # a multirun dir: multirun/<sweep.name>/<timestamp>
out_dir = "report"

# %%
from pathlib import Path

from analysis import plots
from analysis.load import load_sweep
from analysis.render import write_table
from analysis.tables import memory_table

sweep = load_sweep(sweep_dir)
print(sweep.problem_report() or "every run file read")
tables_dir, figures_dir = Path(out_dir) / "tables", Path(out_dir) / "figures"

# %%
table = memory_table(sweep.points)
write_table(table, tables_dir)
table.display

# %%
plot = plots.step_series(sweep.points, sweep.steps, "peak_reserved_bytes")
plots.save_plot(plot, figures_dir);
