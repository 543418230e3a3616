"""The demo's one error type: a one-line reason and what to do."""

from __future__ import annotations

from slurm_tpu.errors import SlurmTpuError


class DemoError(SlurmTpuError):
    """The demo cannot go on; the message says why and what to do."""
