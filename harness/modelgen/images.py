"""Generated test images whose correct answers are known in advance. Seeded, deterministic.

- classification: dark noise with one bright square in a chosen 3x3 grid cell, so the
  brightest-region classifier must answer that cell's label whatever size the image
  is resized from;
- detection/segmentation (:class:`Scene`): red, green and blue rectangles on dark
  noise, of several sizes and aspect ratios, placed so that the detector's grid
  cells frame them exactly once the image is scaled into its input.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import classifier, colours


def bright_region_image(region: int, size: int = 96, seed: int = 0) -> np.ndarray:
    """[size, size, 3] uint8: noise in 0..60 with region ``region`` (0..8) lit to 200..255."""
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 60, size=(size, size, 3), dtype=np.uint8)
    cell = size // classifier.GRID
    row, col = divmod(region, classifier.GRID)
    patch = rng.integers(200, 256, size=(cell, cell, 3), dtype=np.uint8)
    image[row * cell : (row + 1) * cell, col * cell : (col + 1) * cell] = patch
    return image


def write_images(out: Path, count: int, size: int = 96, fmt: str = "png") -> list[tuple[Path, str]]:
    """Write ``count`` images (regions cycle through all nine); returns (path, expected label)."""
    from PIL import Image  # Pillow is only needed to write files, not to build models

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for i in range(count):
        region = i % (classifier.GRID * classifier.GRID)
        path = out / f"img_{i:05d}.{fmt}"
        Image.fromarray(bright_region_image(region, size, seed=i)).save(path, quality=95)
        written.append((path, classifier.LABELS[region]))
    return written


# -- detection and segmentation images -------------------------------------------------


@dataclass(frozen=True)
class Scene:
    """An image of coloured objects on dark noise, and where its objects are."""

    name: str
    width: int
    height: int
    objects: tuple[tuple[int, int, int, int, int], ...]  # (class id, xmin, ymin, xmax, ymax) in pixels

    def pixels(self, seed: int = 0) -> np.ndarray:
        """[height, width, 3] uint8: noise in 0..40, each object filled with its class colour."""
        rng = np.random.default_rng(seed)
        image = rng.integers(0, 40, size=(self.height, self.width, 3), dtype=np.uint8)
        for class_id, x0, y0, x1, y1 in self.objects:
            image[y0:y1, x0:x1] = colours.PAINT[class_id]
        return image


def _cell_object(class_id: int, row: int, col: int, cell: int) -> tuple[int, int, int, int, int]:
    return class_id, col * cell, row * cell, (col + 1) * cell, (row + 1) * cell


# Objects fill whole detector cells once the image is scaled into the 64x64 input
# (cell = 16 / scale original pixels), so the detector's boxes are exactly these.
SCENES = (
    Scene("square_64", 64, 64, (_cell_object(2, 1, 2, 16), _cell_object(0, 3, 0, 16))),
    Scene("landscape_160x96", 160, 96, (_cell_object(0, 0, 1, 40), _cell_object(1, 1, 3, 40))),
    Scene("portrait_96x160", 96, 160, (_cell_object(2, 2, 0, 40), _cell_object(0, 3, 1, 40))),
    Scene("photo_640x480", 640, 480, (_cell_object(1, 0, 0, 160), _cell_object(2, 2, 3, 160))),
    Scene("empty_100x80", 100, 80, ()),
)


def write_scenes(out: Path, fmt: str = "png") -> list[tuple[Path, Scene]]:
    """Write every scene as an image file; returns (path, scene)."""
    from PIL import Image

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for i, scene in enumerate(SCENES):
        path = out / f"{scene.name}.{fmt}"
        Image.fromarray(scene.pixels(seed=i)).save(path)
        written.append((path, scene))
    return written
