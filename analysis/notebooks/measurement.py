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
# # Measurement
# How each point was measured (runs, measured steps, the median with its 95% bootstrap interval, how far its
# repeats lie apart, and what makes it suspect), then what the comparisons between arms can claim: our pass over
# DeepSpeed's pass at one budget and over DeepCompile without offload, each a ratio with its interval. Where the
# points of two arms or more share one workload and budget, a figure draws them side by side with those intervals.
# Then what one allocator retry costs each point, and where each point's device time went.

# %% tags=["parameters"]
sweep_dir = "analysis/fixtures/sweep"  # a multirun dir: multirun/<sweep.name>/<timestamp>
out_dir = "report"

# %%
from analysis import comparison_figures
from analysis.measurement import comparison_table, measurement_table
from analysis.nothing_to_move import has_nothing_to_move, nothing_to_move_table
from analysis.retries import retry_table
from analysis.retry_causes import has_retry_traces, retry_cause_table
from analysis.reuse_check import reuse_check_table
from analysis.wall_time import wall_time_table
from analysis.notebook import open_report

report = open_report(sweep_dir, out_dir)

# %% [markdown]
# Flags: `< 20 steps` (fewer measured steps than the protocol asks of a number that backs a claim),
# `repeats > 3% apart` (the runs' medians), `unsteady (...)` (a run's measured steps trend, its reserved memory
# still grows, or the allocator retried on most steps), and what the machine showed (`clock`, `slowdown`,
# `neighbour`).

# %%
report.table(measurement_table(report.points, report.steps))

# %% [markdown]
# Allocator retries: a retry is a device synchronize, a flush of every cached block and a new cudaMalloc, so steps
# that retry more are slower, and at a memory limit they are the main source of step-time noise. Per point, the
# steps that retried, step time on the steps with the fewest retries and on all, and what one retry costs (the
# Theil-Sen slope of step time on retries per step, "-" where retries do not vary).

# %%
report.table(retry_table(report.points, report.steps))
if has_retry_traces(report.points):  # a traced step (debug.memory_trace_step): why each retry missed
    report.table(retry_cause_table(report.points))

# %%
comparisons = comparison_table(report.points, report.steps)
if not comparisons.values.empty:
    report.table(comparisons)
comparisons.display

# %% [markdown]
# Reused against cold: where a sweep also ran a point cold (`sweep.reuse=false`), the point that took the sweep's
# DeepCompile profiles must plan as it does and run as fast, within the interval.

# %%
reuse_check = reuse_check_table(report.points, report.steps)
if not reuse_check.values.empty:
    report.table(reuse_check)

# %% [markdown]
# Where our pass's time goes when it has nothing to move (where such a point profiled a step): ours against
# DeepCompile per device size, with the retries, copy stalls, compiles and the profiled step's host time by part.

# %%
if has_nothing_to_move(report.points):
    report.table(nothing_to_move_table(report.points, report.steps))

# %% [markdown]
# Where the device time went: per point, the rank's start-up, the compile steps, the other steps and the rest of
# each run's wall time, and the device minutes of all its runs; the last line is the campaign's.

# %%
report.table(wall_time_table(report.points, report.steps))

# %%
if comparison_figures.arms_at_one_point(report.points):
    report.figure(comparison_figures.step_time_by_arm(report.points, report.steps))
