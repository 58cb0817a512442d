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
# `empty_cache` policy (rows) against copy-stream mode (column groups): final-phase median step time, peak
# reserved memory and how far it grew from the first measured step to the last, for every other design point of
# the sweep.

# %% tags=["parameters"]
sweep_dir = "analysis/fixtures/sweep"  # a multirun dir: multirun/<sweep.name>/<timestamp>
out_dir = "report"

# %%
from analysis.measurement import with_reserved_growth
from analysis.notebook import open_report
from analysis.tables import policies_table

report = open_report(sweep_dir, out_dir)

# %%
report.table(policies_table(with_reserved_growth(report.points, report.steps)))
