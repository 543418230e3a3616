"""One exception hierarchy for the whole suite.

Every error carries the key it is about (a device identity, a job id, a file path) as an
attribute, and its one-line message says what is wrong, which thing, and what to do. Only
the CLI turns these into messages and exit codes.
"""

from __future__ import annotations


class SlurmTpuError(Exception):
    """Base class: a problem the user or admin can act on."""


class ConfigError(SlurmTpuError):
    """The YAML config is unreadable, malformed or names an unknown key."""

    def __init__(self, message: str, path: str | None = None, key: str | None = None):
        super().__init__(message)
        self.path = path
        self.key = key


class DetectionError(SlurmTpuError):
    """Hardware could not be enumerated (libudev missing, sysfs unreadable)."""


class OutputError(SlurmTpuError):
    """A generated file could not be written."""

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path


class SlurmCommandError(SlurmTpuError):
    """A Slurm command is missing, timed out or failed."""

    def __init__(self, message: str, command: str, stderr: str = ""):
        super().__init__(message)
        self.command = command
        self.stderr = stderr


class SlurmVersionError(SlurmCommandError):
    """A Slurm client of one release talked to daemons of another (the message names both)."""


class DeviceError(SlurmTpuError):
    """A specific accelerator is missing, busy or unusable."""

    def __init__(self, message: str, identity: str):
        super().__init__(message)
        self.identity = identity
