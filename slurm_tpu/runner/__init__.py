"""Inference runner: TFLite models on the job's Edge TPU(s), GPU or CPU.

The names below are imported on first use, not with the package: the ``slurm-tpu`` CLI imports
``choices`` and ``request`` at start-up for every command, and must not pay for numpy and a runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import BatchSummary, Runner
    from .request import OpenOptions
    from .tasks import Class, Object, Segmentation, TaskOptions

_HOMES = {
    "Runner": "api",
    "BatchSummary": "api",
    "OpenOptions": "request",
    "Class": "tasks",
    "Object": "tasks",
    "Segmentation": "tasks",
    "TaskOptions": "tasks",
}

__all__ = ["Runner", "OpenOptions", "BatchSummary", "Class", "Object", "Segmentation", "TaskOptions"]


def __getattr__(name: str) -> Any:
    """``from slurm_tpu.runner import Runner`` and the like: import the module that defines it."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{home}", __name__), name)
