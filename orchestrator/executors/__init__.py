"""Where experiments run: on this machine one at a time, packed onto GPU slots, or on SLURM."""
