"""A command line made a config, as Hydra composes it, for the driver and the SLURM preview alike: compose.py, the
config Hydra would compose and the points a sweep expands to, without running them; dirnames.py, the point
folders' names. Imports the contract only (Hydra and OmegaConf inside the functions that use them)."""
