"""The runner's errors: one line each, naming the model, device or input, and the fix."""

from __future__ import annotations

from ..errors import DeviceError, SlurmTpuError


class FileError(SlurmTpuError):
    """An error about a file (``path``)."""

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path


class ModelError(FileError):
    """The model file is missing, unreadable, not TFLite, or needs a device we lack."""


class InputError(FileError):
    """An input (image, .npy, list file, directory, glob) is missing or unusable."""


class RuntimeMissingError(SlurmTpuError):
    """Neither ai-edge-litert nor tflite-runtime can be imported."""


class LibEdgeTpuError(FileError):
    """libedgetpu.so.1 (``path``) is missing or lacks the C API the runner needs."""


class DeviceBusyError(DeviceError):
    """Another process already holds this Edge TPU."""

    def __init__(self, message: str, identity: str, pid: int | None):
        super().__init__(message, identity)
        self.pid = pid


class GpuError(DeviceError):
    """The GPU could not be set up through LiteRT's GPU accelerator."""


class UsageError(SlurmTpuError):
    """Options that contradict each other or the job's environment."""
