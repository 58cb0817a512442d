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
# horizontal references. A sweep that gives its offload points one budget gets the table, not the figures.

# %% tags=["parameters"]
sweep_dir = "analysis/fixtures/sweep"  # a multirun dir: multirun/<sweep.name>/<timestamp>
out_dir = "report"

# %%
from analysis import budget_figures
from analysis.notebook import open_report
from analysis.tables import budget_table

report = open_report(sweep_dir, out_dir)

# %%
report.table(budget_table(report.points))

# %%
if budget_figures.budget_swept(report.points):
    report.figure(budget_figures.step_time_vs_budget(report.points))
    report.figure(budget_figures.peak_reserved_vs_budget(report.points))
else:
    print("one budget for every offload point: no figures against the budget")
