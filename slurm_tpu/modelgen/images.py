"""Generated test images whose correct classification is known in advance.

Each image is dark noise with one bright square in a chosen 3x3 grid cell, so the
brightest-region classifier must answer that cell's label whatever size the image
is resized from. Seeded and deterministic.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import classifier


def bright_region_image(region: int, size: int = 96, seed: int = 0) -> np.ndarray:
    """[size, size, 3] uint8: noise in 0..60 with region ``region`` (0..8) lit to 200..255."""
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 60, size=(size, size, 3), dtype=np.uint8)
    cell = size // classifier.GRID
    row, col = divmod(region, classifier.GRID)
    patch = rng.integers(200, 256, size=(cell, cell, 3), dtype=np.uint8)
    image[row * cell:(row + 1) * cell, col * cell:(col + 1) * cell] = patch
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
