"""What a model is: its tensors (:class:`TensorSpec`), what a .tflite file holds (read from
its flatbuffer before any runtime opens it), and the :class:`Engine` protocol every backend
implements. Pure: no runtime imports.

Whether a model was compiled for the Edge TPU (it contains ``edgetpu-custom-op``) must be
known *before* choosing a device, so that a missing TPU is a clear error rather than
"unresolved custom op" from the runtime. The ``tflite`` package is schema code, not a runtime.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from .errors import ModelError

EDGETPU_CUSTOM_OP = "edgetpu-custom-op"


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


@dataclass(frozen=True)
class ModelInfo:
    path: str
    custom_ops: frozenset[str]
    size_bytes: int
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()

    @property
    def is_edgetpu(self) -> bool:
        return EDGETPU_CUSTOM_OP in self.custom_ops


def read_model_info(path: str | Path) -> ModelInfo:
    """Parse the operator codes of a model file; raises ModelError naming the file."""
    path = str(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise ModelError(f"model file {path} does not exist: check the path", path) from None
    except OSError as exc:
        raise ModelError(f"model file {path} cannot be read: {exc.strerror}", path) from None
    # Bytes 4..8 hold the file identifier; every TFLite model carries "TFL3".
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise ModelError(f"model file {path} is not a TFLite model (no TFL3 identifier): pass a .tflite file", path)
    import tflite  # schema package; imported here to keep `slurm-tpu --help` fast

    try:
        model = tflite.Model.GetRootAsModel(data, 0)
        codes = (model.OperatorCodes(i).CustomCode() for i in range(model.OperatorCodesLength()))
        custom = {code.decode("utf-8", "replace") for code in codes if code}
        graph = model.Subgraphs(0)
        inputs = tuple(_spec(graph.Tensors(graph.Inputs(i))) for i in range(graph.InputsLength()))
        outputs = tuple(_spec(graph.Tensors(graph.Outputs(i))) for i in range(graph.OutputsLength()))
    except Exception as exc:  # noqa: BLE001 - a corrupt flatbuffer raises anything from IndexError to struct.error
        raise ModelError(
            f"model file {path} is corrupt ({type(exc).__name__}): rebuild or re-download it", path
        ) from None
    return ModelInfo(path, frozenset(custom), len(data), inputs, outputs)


# tflite.TensorType values -> numpy dtypes (the types image/tensor models use)
_DTYPES = {0: np.float32, 2: np.int32, 3: np.uint8, 4: np.int64, 7: np.int16, 9: np.int8, 1: np.float16, 10: np.float64}


def _spec(tensor) -> TensorSpec:
    """A TensorSpec from a flatbuffer Tensor (per-tensor quantization only)."""
    q = tensor.Quantization()
    scale, zero = 0.0, 0
    if q is not None and q.ScaleLength() == 1:
        scale, zero = float(q.Scale(0)), int(q.ZeroPoint(0))
    shape = tuple(int(tensor.Shape(i)) for i in range(tensor.ShapeLength()))
    dtype = np.dtype(_DTYPES.get(tensor.Type(), np.uint8))
    return TensorSpec(tensor.Name().decode("utf-8", "replace"), shape, dtype, scale, zero)
