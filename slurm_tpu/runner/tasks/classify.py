"""Classification (pycoral's ``adapters/classify.py`` + ``classify_image.py``): top-k classes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..choices import CLASSIFY
from ..modelinfo import TensorSpec
from ..preprocess import Geometry
from .base import Task, TaskOptions, label_of, open_rgb, save_png


@dataclass(frozen=True)
class Class:
    index: int
    label: str
    score: float


def top_classes(
    output: np.ndarray, spec: TensorSpec, labels: Mapping[int, str], top_k: int = 1, threshold: float = 0.0
) -> list[Class]:
    """The ``top_k`` best classes scoring at least ``threshold``, best first (ties: lower index)."""
    scores = spec.dequantize(np.asarray(output).reshape(-1))  # a [1, N] (or [N]) output's
    k = max(0, min(top_k, scores.size))  # 0: an empty slice below
    # A stable sort of all scores: uint8 scores tie often, and argpartition would pick an
    # arbitrary one of the classes tied at the k-th place (a few microseconds for 1001 classes).
    order = np.argsort(-scores, kind="stable")[:k]
    return [Class(int(i), label_of(labels, int(i)), float(scores[i])) for i in order if scores[i] >= threshold]


class Classify(Task):
    name = CLASSIFY
    expects = "one [1, N] output (class scores)"

    def fits(self, outputs: Sequence[TensorSpec], custom_ops: frozenset[str]) -> bool:
        return len(outputs) == 1 and sum(d > 1 for d in outputs[0].shape) == 1  # [N], [1, N], [1, 1, 1, N]...

    def process(
        self, outputs: Sequence[np.ndarray], specs: Sequence[TensorSpec], geometry: Geometry, options: TaskOptions
    ) -> list[Class]:
        return top_classes(outputs[0], specs[0], options.labels, options.top_k, self.threshold(options))

    def record(self, result: list[Class]) -> dict[str, Any]:
        return {"classes": [{"index": c.index, "label": c.label, "score": round(c.score, 6)} for c in result]}

    def lines(self, result: list[Class]) -> list[str]:
        return [f"{c.label}: {c.score:.5f}" for c in result]  # classify_image.py's lines

    def csv_columns(self, options: TaskOptions) -> list[str]:
        return [name for rank in range(1, options.top_k + 1) for name in (f"label{rank}", f"score{rank}")]

    def csv_rows(self, record: dict[str, Any], options: TaskOptions) -> list[list[Any]]:
        row: list[Any] = []
        classes = record.get("classes", [])
        for rank in range(options.top_k):
            row += [classes[rank]["label"], classes[rank]["score"]] if rank < len(classes) else ["", ""]
        return [row]

    def annotate(self, source: str, result: list[Class], target: str) -> None:
        from PIL import ImageDraw

        image = open_rgb(source)
        text = "\n".join(f"{c.label}: {c.score:.2f}" for c in result) or "(no class above threshold)"
        ImageDraw.Draw(image).multiline_text((10, 10), text, fill="red")
        save_png(image, target)
