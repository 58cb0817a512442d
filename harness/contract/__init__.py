"""The contract between the driver, the ranks and the analysis: run files by name and how they are written and read,
statuses and exit codes, units, the config error, env info, the config schema, the measurement protocol, the step
fields and their phase statistics, and the log format. Imports no torch, no Hydra and nothing of the driver or the
rank side (the arm group's schema is the arm's class: harness/arms/, read lazily)."""
