"""Inference runner: TFLite models on the job's Edge TPU(s), GPU or CPU.

Layout (one concern per module; only ``engines`` imports a runtime or libedgetpu):
``devices`` (which device), ``lock`` (one process per TPU), ``modelinfo`` (what the
model is), ``engines`` (LiteRT / tflite-runtime / libedgetpu / GPU), ``session``
(open in the right order, with the right errors), ``preprocess`` (files to tensors,
the pycoral way), ``tasks/`` (what outputs mean: classify, detect, segment, raw),
``inputs`` (listing, sharding over arrays and step tasks), ``results`` (resumable
files), ``pipeline`` (decode ahead, dispatch, keep order), ``progress``,
``benchmark``, and ``api`` (the :class:`Runner` tying them together).
"""

from __future__ import annotations

from .api import BatchSummary, Runner
from .session import OpenOptions
from .tasks import Class, Object, Segmentation, TaskOptions

__all__ = ["Runner", "OpenOptions", "BatchSummary", "Class", "Object", "Segmentation", "TaskOptions"]
