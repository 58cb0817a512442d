"""The contract between the driver, the ranks and the analysis: run files by name and how they are written and read,
statuses and exit codes, units, the config error, env info, the config schema, the measurement protocol, the step
fields and their phase statistics, the log format, and the registry of arm names and classes' dotted paths (the arms
register their classes against it). Imports no Hydra and nothing above it (arms, driver, rank, offload, cluster):
what needs an arm's behaviour is handed it; torch only inside envinfo's function that reads its version."""
