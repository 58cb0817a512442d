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
# # Throughput
# Final-phase median step time and tokens/s per arm along the swept axis (sequence length, else
# micro-batch), with speed-ups against `zero3` and against the best non-offload arm; throughput against
# micro-batch; every point's per-step time with its phase boundaries.

# %% tags=["parameters"]
sweep_dir = "analysis/fixtures/sweep"  # a multirun dir: multirun/<sweep.name>/<timestamp>
out_dir = "report"

# %%
from pathlib import Path

from analysis import plots
from analysis.load import load_sweep
from analysis.render import write_table
from analysis.tables import throughput_table

sweep = load_sweep(sweep_dir)
print(sweep.problem_report() or "every run file read")
tables_dir, figures_dir = Path(out_dir) / "tables", Path(out_dir) / "figures"

# %% [markdown]
# Cells: median over the repeats of each run's final-phase median, `[min, max]` over repeats where they
# differ; a point that did not run shows how it ended (`OOM`, `DIED`, `SKIPPED`, ...).

# %%
table = throughput_table(sweep.points)
write_table(table, tables_dir)
table.display

# %%
plot = plots.throughput_vs_micro_batch(sweep.points)
plots.save_plot(plot, figures_dir);

# %%
plot = plots.step_series(sweep.points, sweep.steps, "step_time_s")
plots.save_plot(plot, figures_dir);
