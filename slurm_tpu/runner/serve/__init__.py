"""``slurm-tpu serve``: models held open on a job's devices behind a TF Serving-style REST API.

One concern per module, each named in its own docstring; ``server`` ties them together.
"""
