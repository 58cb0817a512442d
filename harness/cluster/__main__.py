"""`python -m harness.cluster`: what SLURM would run for a sweep (harness/cluster/preview.py)."""
from harness.cluster.preview import main

if __name__ == "__main__":
    main()
