"""The one gateway to Slurm: which installation, and where any program is (installation.py);
running them (spawn.py) as Slurm's commands, with drain/resume written once (commands.py);
pyslurm behind the same interface (backend.py); and pure parsers of
their output (jobdetail.py, parse.py, gres_index.py)."""
