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
# Peak allocated and reserved memory per phase, bytes offloaded and reloaded per step (GB = 1e9 bytes, as
# everywhere in the harness), allocator retries; peak reserved memory step by step, where growth after a phase
# boundary shows (a diagnostic, in figures/diagnostics).

# %% tags=["parameters"]
sweep_dir = "analysis/fixtures/sweep"  # a multirun dir: multirun/<sweep.name>/<timestamp>
out_dir = "report"

# %%
from analysis import step_figures
from analysis.notebook import open_report
from analysis.memory_tables import has_transfers, memory_table, transfers_table
from analysis.prediction import has_predictions, out_of_sample_pairs, out_of_sample_table, prediction_table

report = open_report(sweep_dir, out_dir)

# %%
report.table(memory_table(report.points))
if has_transfers(report.points):  # our pass's copies: hidden (busy) against exposed (compute waits)
    report.table(transfers_table(report.points))
if has_predictions(report.points):  # the planner's step model against the measured peaks, in and out of sample
    report.table(prediction_table(report.points, report.steps))
    pairs, warnings = out_of_sample_pairs(sweep_dir)  # each profile planning the other points of its shape
    print("\n".join(warnings) or "every profile predicts")
    report.table(out_of_sample_table(report.points, pairs))

# %%
report.diagnostic(step_figures.step_series(report.points, report.steps, "peak_reserved_bytes"));
