"""The one gateway to Slurm: which installation (installation.py), running its programs
(spawn.py, commands.py), pyslurm behind the same interface (pyslurm_backend.py, backend.py),
and pure parsers of their output (jobdetail.py, parse.py, gres_index.py)."""
