"""Read sweeps of run files (or a W&B export) into tidy tables, paper tables and figures."""
