"""Inference runner: TFLite models on the job's Edge TPU(s), GPU or CPU.

Layout (one concern per module; only ``backend`` imports a runtime or libedgetpu):
``devices`` (which device), ``lock`` (one process per TPU), ``modelinfo`` (what the
model is), ``backend`` (LiteRT / tflite-runtime / libedgetpu / GPU), ``session``
(open in the right order, with the right errors), ``preprocess``/``classify``
(tensors in and out), ``inputs`` (listing, sharding), ``results`` (resumable files),
``pipeline`` (decode ahead, dispatch, keep order), ``progress``, ``benchmark``, and
``api`` (the :class:`Runner` tying them together).
"""

from __future__ import annotations

from .api import BatchSummary, Runner
from .classify import Class
from .session import OpenOptions

__all__ = ["Runner", "OpenOptions", "BatchSummary", "Class"]
