"""What every task module provides (:class:`Task`), and what they share: options, labels,
writing annotated images.

A task is pure post-processing on plain numpy, like pycoral's ``adapters/``. Adding a task
is one module plus one line in ``tasks/__init__.py``.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import InputError
from ..modelinfo import TensorSpec
from ..preprocess import Geometry


@dataclass(frozen=True)
class TaskOptions:
    """What a user asks of the results: labels, how many, above which score."""

    labels: Mapping[int, str] = field(default_factory=dict)
    top_k: int = 1
    threshold: float | None = None  # None: the task's own default (pycoral's)


def read_labels(path: str | None) -> dict[int, str]:
    """Labels file: one label per line, or pycoral's ``<index> <label>`` lines (coco_labels.txt)."""
    if not path:
        return {}
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InputError(f"labels file {path} cannot be read ({exc.strerror}): check --labels", path) from None
    except UnicodeDecodeError:
        raise InputError(f"labels file {path} is not UTF-8 text: check --labels", path) from None
    pairs = [re.match(r"^\s*(\d+)[\s:]+(.*\S)\s*$", line) for line in lines if line.strip()]
    if pairs and all(pairs):
        return {int(m.group(1)): m.group(2) for m in pairs if m}
    return {i: line.strip() for i, line in enumerate(lines)}


def label_of(labels: Mapping[int, str], index: int) -> str:
    return labels.get(index, str(index))


def describe_outputs(outputs: Sequence[TensorSpec]) -> str:
    """E.g. ``scores [1, 9] uint8, count [1] float32`` (for error messages)."""
    return ", ".join(f"{o.name} [{', '.join(map(str, o.shape))}] {np.dtype(o.dtype).name}" for o in outputs)


class Task:
    """One kind of model output. Subclasses set the class attributes and override the methods."""

    name: ClassVar[str]
    expects: ClassVar[str]  # the output signature, in words (for --help and errors)
    keep_aspect: ClassVar[bool] = False  # preprocessing: pycoral's set_resized_input
    default_threshold: ClassVar[float] = 0.0
    time_format: ClassVar[str] = "{:.1f}ms"  # per-inference lines of the single-input printout
    draws: ClassVar[bool] = True  # has an annotated image (--annotate)

    def fits(self, outputs: Sequence[TensorSpec], custom_ops: frozenset[str]) -> bool:
        """Whether a model with these outputs (and custom operators) is this task's."""
        raise NotImplementedError

    def threshold(self, options: TaskOptions) -> float:
        return self.default_threshold if options.threshold is None else options.threshold

    def process(
        self, outputs: Sequence[np.ndarray], specs: Sequence[TensorSpec], geometry: Geometry, options: TaskOptions
    ) -> Any:
        """The result of one inference (a task-specific value)."""
        raise NotImplementedError

    def record(self, result: Any) -> dict[str, Any]:
        """The JSON fields of one result (the caller adds ``input``)."""
        raise NotImplementedError

    def lines(self, result: Any) -> list[str]:
        """The RESULTS section of the single-input printout."""
        raise NotImplementedError

    def csv_columns(self, options: TaskOptions) -> list[str]:
        """CSV columns between ``input`` and ``error``."""
        raise NotImplementedError

    def csv_rows(self, record: dict[str, Any], options: TaskOptions) -> list[list[Any]]:
        """Values for :meth:`csv_columns`, one list per row; none writes one row with the input alone."""
        raise NotImplementedError

    def annotate(self, source: str, result: Any, target: str) -> None:
        """Write an annotated image of ``result`` for the input file ``source`` to ``target``."""
        raise NotImplementedError


def open_rgb(path: str):
    """The input image as RGB, for drawing on (errors as one-line InputErrors)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise InputError(
            f"input {path} cannot be annotated: not a readable image ({type(exc).__name__})", path
        ) from None


def save_png(image, target: str) -> None:
    """Save as PNG atomically: a killed run never leaves a torn image behind."""
    directory = os.path.dirname(target) or "."
    fd, tmp = tempfile.mkstemp(prefix=".annotate-", suffix=".png", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            image.save(handle, format="PNG")
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
