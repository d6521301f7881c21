"""Grids of cells: the spec a YAML file declares, what a job does and what a dry run plans, and the executors that
run the jobs (here, on submitit's local or Slurm executor)."""
