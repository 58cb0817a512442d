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
# micro-batch where the sweep varies it; at a fixed global batch (micro-batch x gradient accumulation), each arm's
# step time, tokens/s and offload cycles per optimizer step at every micro-batch, and throughput until it runs out
# of memory; every point's per-step time with its phase boundaries (a diagnostic, in figures/diagnostics).

# %% tags=["parameters"]
sweep_dir = "analysis/fixtures/sweep"  # a multirun dir: multirun/<sweep.name>/<timestamp>
out_dir = "report"

# %%
from analysis import step_figures, throughput_figures
from analysis.accumulation import accumulation_lines, write_accumulation_files
from analysis.design import varies
from analysis.notebook import open_report
from analysis.tables import throughput_table

report = open_report(sweep_dir, out_dir)

# %% [markdown]
# Cells: median over the repeats of each run's final-phase median, `[min, max]` over repeats where they
# differ; a point that did not run shows how it ended (`OOM`, `DIED`, `SKIPPED`, ...).

# %%
report.table(throughput_table(report.points))

# %%
if varies(report.points["micro_batch"]):
    report.figure(throughput_figures.throughput_vs_micro_batch(report.points))
else:
    print("one micro-batch in this sweep: no figure against it")

# %% [markdown]
# At one global batch: `accumulation_<G>seq` (tables) and `accumulation_throughput_<G>seq` (figures) per global
# batch G at which micro-batch and gradient accumulation vary together; nothing for other sweeps.

# %%
print("\n".join(accumulation_lines(report.points)))
written = write_accumulation_files(report.points, report.out_dir)
if written:
    print("\n".join(str(path.relative_to(report.out_dir)) for path in written))

# %%
report.diagnostic(step_figures.step_series(report.points, report.steps, "step_time_s"));
