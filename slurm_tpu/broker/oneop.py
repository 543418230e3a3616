"""An Edge TPU executable as a model the broker can run: one ``edgetpu-custom-op`` operator.

A job's unmodified pycoral/tflite code on a shard runs its model in its own process; the node's
libedgetpu (slurm-tpu's patch, scripts/libedgetpu-broker.patch) claims each ``edgetpu-custom-op``
node and sends the broker that node's compiled executable (its custom options) with the node's
input and output tensors (``load`` with ``"kind": "executable"``, protocol/broker_wire.py). The
broker then runs it the ordinary public way: :func:`build` wraps the executable in a .tflite of
one CUSTOM operator with exactly those tensors (shapes, types, quantization), which the device's
own libedgetpu delegate claims like any compiled model's op.

The job's request is hostile input: :func:`declared_tensors` bounds every spec before anything
is built. Written with the ``tflite`` schema package (generated flatbuffer code, not a runtime)
and ``flatbuffers``, as the runner reads models (runner/modelinfo.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..protocol import FormatError, broker_wire as wire
from ..runner.modelinfo import EDGETPU_CUSTOM_OP, TensorSpec

MAX_TENSORS = 64  # per side of one op (compiled models have a handful)
MAX_DIMS = 16
MAX_NAME = 256

# numpy dtype name -> tflite.TensorType value (schema.fbs), the types a tensor spec may name.
TENSOR_TYPES = {
    "float32": 0,
    "float16": 1,
    "int32": 2,
    "uint8": 3,
    "int64": 4,
    "bool": 6,
    "int16": 7,
    "int8": 9,
    "float64": 10,
    "uint64": 12,
    "uint32": 15,
    "uint16": 16,
}


def _spec(data: object, where: str) -> TensorSpec:
    if not isinstance(data, dict):
        raise FormatError(f"{where} is not a tensor spec")
    name, shape, dtype = data.get("name", ""), data.get("shape"), data.get("dtype")
    quantization = data.get("quantization") or [0.0, 0]
    if not isinstance(name, str) or len(name) > MAX_NAME:
        raise FormatError(f"{where}: 'name' is not a string of at most {MAX_NAME} characters")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_DIMS
        or not all(isinstance(d, int) and not isinstance(d, bool) and 0 < d < 2**31 for d in shape)
    ):
        raise FormatError(f"{where}: 'shape' is not a list of at most {MAX_DIMS} positive integers")
    if dtype not in TENSOR_TYPES:
        raise FormatError(f"{where}: dtype {str(dtype)[:20]!r} is not one of {', '.join(TENSOR_TYPES)}")
    if (
        not isinstance(quantization, list)
        or len(quantization) != 2
        or not isinstance(quantization[0], (int, float))
        or isinstance(quantization[1], bool)
        or not isinstance(quantization[1], int)
        or not -(2**31) <= quantization[1] < 2**31
    ):
        raise FormatError(f"{where}: 'quantization' is not [scale, zero_point]")
    spec = TensorSpec(name, tuple(shape), np.dtype(dtype), float(quantization[0]), int(quantization[1]))
    if int(np.prod(spec.shape, dtype=np.int64)) * spec.dtype.itemsize > wire.MAX_PAYLOAD:
        raise FormatError(f"{where}: a tensor of {spec.shape} {dtype} is larger than one request may be")
    return spec


def declared_tensors(header: dict) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The (inputs, outputs) an executable ``load`` declares; FormatError (one line) for anything else."""
    sides = []
    for side in ("inputs", "outputs"):
        items = header.get(side)
        if not isinstance(items, list) or not 0 < len(items) <= MAX_TENSORS:
            raise FormatError(f"an executable load needs '{side}': a list of 1 to {MAX_TENSORS} tensor specs")
        sides.append([_spec(item, f"{side}[{i}]") for i, item in enumerate(items)])
    return sides[0], sides[1]


def build(executable: bytes, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> bytes:
    """A .tflite of one ``edgetpu-custom-op`` whose custom options are ``executable``, from
    ``inputs`` to ``outputs`` (the model's inputs and outputs, in order)."""
    import flatbuffers
    import tflite

    b = flatbuffers.Builder(len(executable) + 1024 + 256 * (len(inputs) + len(outputs)))

    def ints(start, values: Sequence[int]) -> int:
        start(b, len(values))
        for value in reversed(values):
            b.PrependInt32(int(value))
        return b.EndVector()

    def tables(start, items: Sequence[int]) -> int:
        start(b, len(items))
        for item in reversed(items):
            b.PrependUOffsetTRelative(item)
        return b.EndVector()

    specs = [*inputs, *outputs]
    tensors = []
    for index, spec in enumerate(specs):
        name = b.CreateString(spec.name or f"tensor_{index}")
        shape = ints(tflite.TensorStartShapeVector, spec.shape)
        quantization = None
        if spec.scale or spec.zero_point:
            scale = b.CreateNumpyVector(np.asarray([spec.scale], dtype=np.float32))
            zero = b.CreateNumpyVector(np.asarray([spec.zero_point], dtype=np.int64))
            tflite.QuantizationParametersStart(b)
            tflite.QuantizationParametersAddScale(b, scale)
            tflite.QuantizationParametersAddZeroPoint(b, zero)
            quantization = tflite.QuantizationParametersEnd(b)
        tflite.TensorStart(b)
        tflite.TensorAddShape(b, shape)
        tflite.TensorAddType(b, TENSOR_TYPES[spec.dtype.name])
        tflite.TensorAddBuffer(b, index + 1)  # its own empty buffer, as the converter writes activations
        tflite.TensorAddName(b, name)
        if quantization is not None:
            tflite.TensorAddQuantization(b, quantization)
        tensors.append(tflite.TensorEnd(b))

    custom = b.CreateByteVector(bytes(executable))
    op_inputs = ints(tflite.OperatorStartInputsVector, range(len(inputs)))
    op_outputs = ints(tflite.OperatorStartOutputsVector, range(len(inputs), len(specs)))
    tflite.OperatorStart(b)
    tflite.OperatorAddOpcodeIndex(b, 0)
    tflite.OperatorAddInputs(b, op_inputs)
    tflite.OperatorAddOutputs(b, op_outputs)
    tflite.OperatorAddCustomOptions(b, custom)
    tflite.OperatorAddCustomOptionsFormat(b, tflite.CustomOptionsFormat.FLEXBUFFERS)
    operator = tflite.OperatorEnd(b)

    subgraph_tensors = tables(tflite.SubGraphStartTensorsVector, tensors)
    subgraph_operators = tables(tflite.SubGraphStartOperatorsVector, [operator])
    subgraph_inputs = ints(tflite.SubGraphStartInputsVector, range(len(inputs)))
    subgraph_outputs = ints(tflite.SubGraphStartOutputsVector, range(len(inputs), len(specs)))
    subgraph_name = b.CreateString("main")
    tflite.SubGraphStart(b)
    tflite.SubGraphAddTensors(b, subgraph_tensors)
    tflite.SubGraphAddInputs(b, subgraph_inputs)
    tflite.SubGraphAddOutputs(b, subgraph_outputs)
    tflite.SubGraphAddOperators(b, subgraph_operators)
    tflite.SubGraphAddName(b, subgraph_name)
    subgraph = tflite.SubGraphEnd(b)

    custom_code = b.CreateString(EDGETPU_CUSTOM_OP)
    tflite.OperatorCodeStart(b)
    tflite.OperatorCodeAddDeprecatedBuiltinCode(b, tflite.BuiltinOperator.CUSTOM)
    tflite.OperatorCodeAddBuiltinCode(b, tflite.BuiltinOperator.CUSTOM)
    tflite.OperatorCodeAddCustomCode(b, custom_code)
    tflite.OperatorCodeAddVersion(b, 1)
    code = tflite.OperatorCodeEnd(b)

    buffers = []
    for _ in range(len(specs) + 1):  # buffer 0: the empty sentinel every model starts with
        tflite.BufferStart(b)
        buffers.append(tflite.BufferEnd(b))
    model_codes = tables(tflite.ModelStartOperatorCodesVector, [code])
    model_subgraphs = tables(tflite.ModelStartSubgraphsVector, [subgraph])
    model_buffers = tables(tflite.ModelStartBuffersVector, buffers)
    description = b.CreateString("slurm-tpu broker: one Edge TPU executable")
    tflite.ModelStart(b)
    tflite.ModelAddVersion(b, 3)
    tflite.ModelAddOperatorCodes(b, model_codes)
    tflite.ModelAddSubgraphs(b, model_subgraphs)
    tflite.ModelAddDescription(b, description)
    tflite.ModelAddBuffers(b, model_buffers)
    b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def same_tensors(declared: Sequence[TensorSpec], built: Sequence[TensorSpec]) -> bool:
    """Whether the model the broker built has the declared tensors' shapes and types (their bytes)."""
    return len(declared) == len(built) and all(
        tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype for a, b in zip(declared, built)
    )


def describe(specs: Sequence[TensorSpec]) -> str:
    return ", ".join(f"{s.dtype.name}{list(s.shape)}" for s in specs)
