"""Semantic segmentation (pycoral's ``adapters/segment.py`` + ``semantic_segmentation.py``).

The output is a class map [1, H, W] or per-class scores [1, H, W, C] (argmax taken,
as pycoral does, on the raw values). With ``--keep-aspect-ratio`` the padding is cut
off (pycoral's ``result[:new_height, :new_width]``). The map is then resized back to
the source image (nearest neighbour), which gives the per-class pixel fractions and
the colour mask (PASCAL VOC colours, as pycoral's ``label_to_color_image``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..choices import SEGMENT
from ..modelinfo import TensorSpec
from ..preprocess import Geometry
from .base import Task, TaskOptions, label_of, save_png


@dataclass(frozen=True)
class Segmentation:
    """A class map at the source image's size and the fraction of its pixels per class."""

    class_map: np.ndarray  # [height, width] class ids
    fractions: list[tuple[int, str, float]]  # (id, label, fraction), largest first; present classes only


def pascal_colormap() -> np.ndarray:
    """[256, 3] uint8: the PASCAL VOC label colours (class id bits spread over R, G, B)."""
    colormap = np.zeros((256, 3), dtype=np.int64)
    indices = np.arange(256, dtype=np.int64)
    for shift in reversed(range(8)):
        for channel in range(3):
            colormap[:, channel] |= ((indices >> channel) & 1) << shift
        indices >>= 3
    return colormap.astype(np.uint8)


def resize_map(class_map: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Nearest-neighbour resize of a class map to (width, height)."""
    from PIL import Image

    if class_map.shape[::-1] == size:
        return class_map
    mode_type = np.uint8 if class_map.max(initial=0) < 256 else np.int32
    image = Image.fromarray(class_map.astype(mode_type))
    # Image.Resampling needs Pillow 9.1; the module-level names are set by a loop mypy cannot follow.
    return np.asarray(image.resize(size, Image.NEAREST))  # type: ignore[attr-defined]


def segment(output: np.ndarray, geometry: Geometry, labels) -> Segmentation:
    """The class map back at the source's size, and per-class fractions."""
    result = np.asarray(output)[0]  # [H, W] class ids, or [H, W, C] scores: their argmax
    class_map = np.argmax(result, axis=-1) if result.ndim == 3 else result
    input_size = geometry.input
    if input_size is not None and geometry.resized is not None and geometry.resized != input_size:
        # Padded input: keep the part of the map that covers the image (the map may be
        # smaller than the input, so scale the cut).
        map_h, map_w = class_map.shape
        keep_w = max(1, round(map_w * geometry.resized[0] / input_size[0]))
        keep_h = max(1, round(map_h * geometry.resized[1] / input_size[1]))
        class_map = class_map[:keep_h, :keep_w]
    if geometry.size is not None:
        class_map = resize_map(class_map, geometry.size)
    counts = np.bincount(class_map.reshape(-1).astype(np.int64))
    total = max(1, class_map.size)
    present = [(int(i), label_of(labels, int(i)), float(n) / total) for i, n in enumerate(counts) if n]
    present.sort(key=lambda item: (-item[2], item[0]))
    return Segmentation(class_map, present)


class Segment(Task):
    name = SEGMENT
    expects = "one [1, H, W] class map or [1, H, W, C] per-class scores"

    def __init__(self, keep_aspect: bool = False):
        self.keep_aspect = keep_aspect  # type: ignore[misc]  # pycoral's --keep_aspect_ratio

    def fits(self, outputs: Sequence[TensorSpec], custom_ops: frozenset[str]) -> bool:
        if len(outputs) != 1:
            return False
        shape = outputs[0].shape
        return len(shape) in (3, 4) and shape[0] == 1 and shape[1] > 1 and shape[2] > 1

    def process(
        self, outputs: Sequence[np.ndarray], specs: Sequence[TensorSpec], geometry: Geometry, options: TaskOptions
    ) -> Segmentation:
        return segment(outputs[0], geometry, options.labels)

    def record(self, result: Segmentation) -> dict[str, Any]:
        height, width = result.class_map.shape
        return {
            "size": [width, height],
            "classes": [{"id": i, "label": label, "fraction": round(f, 6)} for i, label, f in result.fractions],
        }

    def lines(self, result: Segmentation) -> list[str]:
        return [f"{label}: {fraction:.5f}" for _, label, fraction in result.fractions]

    def csv_columns(self, options: TaskOptions) -> list[str]:
        return ["id", "label", "fraction", "annotated"]

    def csv_rows(self, record: dict[str, Any], options: TaskOptions) -> list[list[Any]]:
        mask = record.get("annotated", "")
        return [[c["id"], c["label"], c["fraction"], mask] for c in record.get("classes", [])]

    def annotate(self, source: str, result: Segmentation, target: str) -> None:
        """The colour-mapped mask at the source's size (class id -> PASCAL colour)."""
        from PIL import Image

        colors = pascal_colormap()[np.clip(result.class_map, 0, 255).astype(np.int64)]
        save_png(Image.fromarray(colors, "RGB"), target)
