"""slurm-tpu: Edge TPUs and GPUs as allocatable, isolated Slurm resources."""

__version__ = "0.1.0"
