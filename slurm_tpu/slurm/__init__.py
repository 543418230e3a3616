"""Everything that talks to Slurm: command runners and pure parsers of their output."""
