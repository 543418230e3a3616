"""Object detection (pycoral's ``adapters/detect.py`` + ``detect_image.py``).

Models end in ``TFLite_Detection_PostProcess``: four outputs, boxes [1, M, 4]
(ymin, xmin, ymax, xmax, normalized to the input), class ids [1, M], scores [1, M]
and the count [1]. The input was filled with pycoral's ``set_resized_input`` (aspect
kept, padded right/bottom), so a box maps back to the original image by
``input size / scale`` and, as in pycoral, is truncated to whole pixels.
Models keep detections with scores near 0, so the threshold (0.4 by default, as
detect_image.py) is ours to apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..choices import DETECT
from ..modelinfo import TensorSpec
from ..preprocess import Geometry
from .base import Task, TaskOptions, label_of, open_rgb, save_png


@dataclass(frozen=True)
class Object:
    """One detection: class id, its label, score and box (xmin, ymin, xmax, ymax) in source pixels."""

    id: int
    label: str
    score: float
    bbox: tuple[int, int, int, int]


def get_objects(
    outputs: Sequence[np.ndarray],
    specs: Sequence[TensorSpec],
    input_size: tuple[int, int],
    scale: tuple[float, float],
    threshold: float,
    labels,
) -> list[Object]:
    """pycoral's ``detect.get_objects``: objects scoring at least ``threshold``, boxes in source pixels."""
    boxes, classes, scores = (spec.dequantize(np.asarray(o))[0] for o, spec in zip(outputs[:3], specs[:3]))
    count = int(specs[3].dequantize(np.asarray(outputs[3])).reshape(-1)[0])
    sx, sy = input_size[0] / scale[0], input_size[1] / scale[1]
    found = []
    for i in range(min(count, len(scores))):
        if scores[i] < threshold:
            continue
        ymin, xmin, ymax, xmax = (float(v) for v in boxes[i])
        found.append(
            Object(
                int(classes[i]),
                label_of(labels, int(classes[i])),
                float(scores[i]),
                (int(xmin * sx), int(ymin * sy), int(xmax * sx), int(ymax * sy)),
            )
        )
    return found


class Detect(Task):
    name = DETECT
    expects = "TFLite_Detection_PostProcess's four outputs: boxes [1, M, 4], classes [1, M], scores [1, M], count [1]"
    keep_aspect = True
    default_threshold = 0.4  # detect_image.py's
    time_format = "{:.2f} ms"  # detect_image.py's

    def fits(self, outputs: Sequence[TensorSpec], custom_ops: frozenset[str]) -> bool:
        """boxes [1, M, 4], classes [1, M], scores [1, M], count [1], in that order (TF1 SSDs)."""
        if len(outputs) != 4:
            return False
        boxes, classes, scores, count = (o.shape for o in outputs)
        return len(boxes) == 3 and boxes[2] == 4 and classes == scores == boxes[:2] and tuple(count) in ((1,), (1, 1))

    def process(
        self, outputs: Sequence[np.ndarray], specs: Sequence[TensorSpec], geometry: Geometry, options: TaskOptions
    ) -> list[Object]:
        input_size = geometry.input or (1, 1)  # a non-image input: boxes stay normalized
        return get_objects(outputs, specs, input_size, geometry.scale, self.threshold(options), options.labels)

    def record(self, result: list[Object]) -> dict[str, Any]:
        return {
            "objects": [
                {"id": o.id, "label": o.label, "score": round(o.score, 6), "bbox": list(o.bbox)} for o in result
            ]
        }

    def lines(self, result: list[Object]) -> list[str]:
        if not result:
            return ["No objects detected"]  # detect_image.py's words
        return [f"{o.label}: {o.score:.5f} ({o.bbox[0]}, {o.bbox[1]}, {o.bbox[2]}, {o.bbox[3]})" for o in result]

    def csv_columns(self, options: TaskOptions) -> list[str]:
        return ["id", "label", "score", "xmin", "ymin", "xmax", "ymax"]

    def csv_rows(self, record: dict[str, Any], options: TaskOptions) -> list[list[Any]]:
        return [[o["id"], o["label"], o["score"], *o["bbox"]] for o in record.get("objects", [])]

    def annotate(self, source: str, result: list[Object], target: str) -> None:
        """The source image with each box and its label and score drawn (as detect_image.py -o)."""
        from PIL import ImageDraw

        image = open_rgb(source)
        draw = ImageDraw.Draw(image)
        width = max(1, round(max(image.size) / 300))  # visible on photos, thin on thumbnails
        for o in result:
            xmin, ymin, xmax, ymax = o.bbox
            draw.rectangle([(xmin, ymin), (max(xmin, xmax), max(ymin, ymax))], outline="red", width=width)
            draw.text((xmin + 10, ymin + 10), f"{o.label}\n{o.score:.2f}", fill="red")
        save_png(image, target)
