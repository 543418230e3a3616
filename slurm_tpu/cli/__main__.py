"""``python -m slurm_tpu.cli`` — the same as the ``slurm-tpu`` console script."""

from . import run

run()
