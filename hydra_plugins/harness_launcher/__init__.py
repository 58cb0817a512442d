"""Hydra takes launchers only from the hydra_plugins namespace: the harness's SLURM launcher, whose work is in
harness/cluster/launcher.py, goes by this name in conf/launcher/slurm.yaml (hydra.launcher._target_)."""
from harness.cluster import launcher


class SlurmLauncher(launcher.SlurmLauncher):
    """harness.cluster.launcher.SlurmLauncher, under a name Hydra accepts."""
