"""One rank of a point (torchrun starts `python -m harness.rank.worker RUN_DIR`; no Hydra): the emulated device, the
model, the arm's engine and compile schedule, the measured step loop, the memory monitor and the looks inside a
step (diagnostics, memory trace, the machine's readings)."""
