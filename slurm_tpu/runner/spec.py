"""Plain descriptions of tensors and the Engine protocol every backend implements.

Pure: no runtime imports, so preprocessing, batching and tests can use them freely.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output as the runtime reports it."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    scale: float = 0.0  # 0.0: not quantized
    zero_point: int = 0

    @property
    def quantized(self) -> bool:
        return self.scale != 0.0

    def dequantize(self, values: np.ndarray) -> np.ndarray:
        """Real values of a tensor of this spec (float32)."""
        if not self.quantized:
            return values.astype(np.float32, copy=False)
        return (values.astype(np.float32) - self.zero_point) * self.scale


class Engine(Protocol):
    """A loaded model on one device. Not thread-safe: one thread drives one engine."""

    label: str  # e.g. "edgetpu usb-2-1.3", "cpu", "gpu"
    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run one inference; returns copies of the outputs (safe to keep)."""
        ...

    def close(self) -> None:
        """Release the interpreter, then the device (in that order)."""
        ...
