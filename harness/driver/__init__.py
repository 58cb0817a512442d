"""The driver: one process per point, started by Hydra (`python -m harness.run`). It checks and resolves the config,
writes the run dir, launches the point's ranks with torchrun, watches them (timeout, stall, signals), classifies the
outcome, summarises it and mirrors it to W&B; its console output is console.py's. No torch at start-up."""
