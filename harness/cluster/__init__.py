"""Cluster scale (SLURM), one module per job:

- nodes.py: where this driver sits in a SLURM job, how its node joins the point's rendezvous, and the torchrun
  command and environment of its ranks;
- stops.py: SLURM's stop signals and requeue, and a failed node stopping the others;
- launcher.py: the Hydra launcher of `launcher=slurm`: the requeue flag, and a wait for each job that ends when
  SLURM says the job ended, recording a point whose job left no result;
- preview.py: what SLURM would run (`python -m harness.cluster`): the sbatch script and every node's command.

The dry run's memory estimate (`estimate_only=true`) is harness/driver/estimate.py. Nothing here imports the driver:
what the cluster side needs of it is handed in (the Hydra plugin class hands the launcher the driver's record).
"""
