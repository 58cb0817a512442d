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
# # Capacity
# Under an emulated device (`env.device_memory_gb`): final-phase median s/step per arm along the ladder
# (sequence length, else micro-batch), `OOM (pN)` where a point ran out of memory in phase N, `OOM (build)`
# before step 0, and the largest ladder value that fits; throughput until each arm runs out, and peak
# reserved memory against the emulated device. One table and two figures per emulated size, named by it
# (`capacity_24gb`); a sweep on real devices only gets none.

# %% tags=["parameters"]
sweep_dir = "analysis/fixtures/sweep"  # a multirun dir: multirun/<sweep.name>/<timestamp>
out_dir = "report"

# %%
from analysis.capacity import capacity_lines, write_capacity_files
from analysis.notebook import open_report

report = open_report(sweep_dir, out_dir)
print("\n".join(capacity_lines(report.points)))

# %%
written = write_capacity_files(report.points, report.out_dir)
if written:
    print("\n".join(str(path.relative_to(report.out_dir)) for path in written))
