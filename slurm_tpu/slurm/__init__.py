"""The one gateway to Slurm: the installation (installation.py), running its programs (spawn.py,
commands.py), pyslurm behind the same interface (backend.py), and pure parsers of their output."""
