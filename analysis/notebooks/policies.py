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
# # Policies
# `empty_cache` policy (rows) against copy-stream mode (column groups): final-phase median step time and
# peak reserved memory, for every other design point of the sweep.

# %% tags=["parameters"]
sweep_dir = "analysis/fixtures/sweep"  # a multirun dir: multirun/<sweep.name>/<timestamp>
out_dir = "report"

# %%
from pathlib import Path

from analysis.load import load_sweep
from analysis.render import write_table
from analysis.tables import policies_table

sweep = load_sweep(sweep_dir)
print(sweep.problem_report() or "every run file read")

# %%
table = policies_table(sweep.points)
write_table(table, Path(out_dir) / "tables")
table.display
