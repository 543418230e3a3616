"""A tiny graph builder that serialises TFLite flatbuffers without TensorFlow.

Only what our generated models need: one subgraph, constant buffers, per-tensor
(or per-channel) quantization, builtin operators with their options and custom
operators with FlexBuffer options (``edgetpu-custom-op`` for a model that *looks*
compiled for the Edge TPU; ``TFLite_Detection_PostProcess`` for SSD detectors).
The schema comes from the ``tflite`` package (generated flatbuffer code).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable

import flatbuffers
import numpy as np
import tflite

# numpy dtype -> tflite.TensorType
_TENSOR_TYPES = {
    np.dtype(np.float32): tflite.TensorType.FLOAT32,
    np.dtype(np.int32): tflite.TensorType.INT32,
    np.dtype(np.uint8): tflite.TensorType.UINT8,
    np.dtype(np.int8): tflite.TensorType.INT8,
    np.dtype(np.int64): tflite.TensorType.INT64,
}

OptionsWriter = Callable[[flatbuffers.Builder], int]


@dataclass(frozen=True)
class Quant:
    """Affine quantization: real = scale * (q - zero_point)."""

    scale: Sequence[float]
    zero_point: Sequence[int]
    axis: int = 0

    @classmethod
    def per_tensor(cls, scale: float, zero_point: int) -> Quant:
        return cls([float(scale)], [int(zero_point)])


@dataclass
class _Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    quant: Quant | None
    buffer: int


@dataclass
class _Op:
    opcode: int
    inputs: list[int]
    outputs: list[int]
    options_type: int
    options: OptionsWriter | None
    custom_options: bytes | None = None  # a custom operator's FlexBuffer


@dataclass
class Graph:
    """One subgraph under construction; ``serialize()`` returns the .tflite bytes."""

    description: str = "slurm-tpu generated model"
    _tensors: list[_Tensor] = field(default_factory=list)
    _buffers: list[np.ndarray | None] = field(default_factory=lambda: [None])  # buffer 0: empty sentinel
    _opcodes: list[tuple[int, str | None]] = field(default_factory=list)
    _ops: list[_Op] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)

    def tensor(
        self, name: str, shape: Sequence[int], dtype, quant: Quant | None = None, data: np.ndarray | None = None
    ) -> int:
        """Add a tensor (constant when ``data`` is given); returns its index."""
        dtype = np.dtype(dtype)
        buffer = 0
        if data is not None:
            data = np.ascontiguousarray(data, dtype=dtype)
            if tuple(data.shape) != tuple(shape):
                raise ValueError(f"{name}: data shape {data.shape} != {tuple(shape)}")
            self._buffers.append(data)
            buffer = len(self._buffers) - 1
        else:
            self._buffers.append(None)  # one empty buffer per activation, as the converter does
            buffer = len(self._buffers) - 1
        self._tensors.append(_Tensor(name, tuple(int(d) for d in shape), dtype, quant, buffer))
        return len(self._tensors) - 1

    def shape(self, index: int) -> tuple[int, ...]:
        return self._tensors[index].shape

    def _opcode(self, builtin: int, custom: str | None) -> int:
        key = (builtin, custom)
        if key not in self._opcodes:
            self._opcodes.append(key)
        return self._opcodes.index(key)

    def op(
        self,
        builtin: int,
        inputs: Sequence[int],
        outputs: Sequence[int],
        options_type: int = 0,
        options: OptionsWriter | None = None,
    ) -> None:
        """Append a builtin operator (``builtin`` is a tflite.BuiltinOperator value)."""
        self._ops.append(_Op(self._opcode(builtin, None), list(inputs), list(outputs), options_type, options))

    def custom_op(self, name: str, inputs: Sequence[int], outputs: Sequence[int], options: bytes | None = None) -> None:
        """Append a custom operator (e.g. ``edgetpu-custom-op``); ``options`` is its FlexBuffer."""
        self._ops.append(
            _Op(self._opcode(tflite.BuiltinOperator.CUSTOM, name), list(inputs), list(outputs), 0, None, options)
        )

    # -- serialisation -------------------------------------------------------------

    def serialize(self) -> bytes:
        b = flatbuffers.Builder(1024 + sum(a.nbytes for a in self._buffers if a is not None))

        def int_vector(start: Callable[[flatbuffers.Builder, int], None], values: Sequence[int]) -> int:
            start(b, len(values))
            for v in reversed(values):
                b.PrependInt32(int(v))
            return b.EndVector()

        buffers = []
        for data in self._buffers:
            vec = None
            if data is not None:
                # Constant data is 16-byte aligned, as the converter writes it.
                b.StartVector(1, data.nbytes, 16)
                b.head = b.head - data.nbytes
                b.Bytes[b.head : b.head + data.nbytes] = data.tobytes()
                vec = b.EndVector()
            tflite.BufferStart(b)
            if vec is not None:
                tflite.BufferAddData(b, vec)
            buffers.append(tflite.BufferEnd(b))

        tensors = []
        for t in self._tensors:
            name = b.CreateString(t.name)
            shape = int_vector(tflite.TensorStartShapeVector, t.shape)
            quant = None
            if t.quant is not None:
                scale = b.CreateNumpyVector(np.asarray(t.quant.scale, dtype=np.float32))
                zero = b.CreateNumpyVector(np.asarray(t.quant.zero_point, dtype=np.int64))
                tflite.QuantizationParametersStart(b)
                tflite.QuantizationParametersAddScale(b, scale)
                tflite.QuantizationParametersAddZeroPoint(b, zero)
                tflite.QuantizationParametersAddQuantizedDimension(b, t.quant.axis)
                quant = tflite.QuantizationParametersEnd(b)
            tflite.TensorStart(b)
            tflite.TensorAddShape(b, shape)
            tflite.TensorAddType(b, _TENSOR_TYPES[t.dtype])
            tflite.TensorAddBuffer(b, t.buffer)
            tflite.TensorAddName(b, name)
            if quant is not None:
                tflite.TensorAddQuantization(b, quant)
            tensors.append(tflite.TensorEnd(b))

        ops = []
        for o in self._ops:
            options = o.options(b) if o.options else None
            custom = b.CreateByteVector(o.custom_options) if o.custom_options else None
            ins = int_vector(tflite.OperatorStartInputsVector, o.inputs)
            outs = int_vector(tflite.OperatorStartOutputsVector, o.outputs)
            tflite.OperatorStart(b)
            tflite.OperatorAddOpcodeIndex(b, o.opcode)
            tflite.OperatorAddInputs(b, ins)
            tflite.OperatorAddOutputs(b, outs)
            if options is not None:
                tflite.OperatorAddBuiltinOptionsType(b, o.options_type)
                tflite.OperatorAddBuiltinOptions(b, options)
            if custom is not None:
                tflite.OperatorAddCustomOptions(b, custom)
                tflite.OperatorAddCustomOptionsFormat(b, tflite.CustomOptionsFormat.FLEXBUFFERS)
            ops.append(tflite.OperatorEnd(b))

        def table_vector(start: Callable[[flatbuffers.Builder, int], None], items: list[int]) -> int:
            start(b, len(items))
            for item in reversed(items):
                b.PrependUOffsetTRelative(item)
            return b.EndVector()

        sub_tensors = table_vector(tflite.SubGraphStartTensorsVector, tensors)
        sub_ops = table_vector(tflite.SubGraphStartOperatorsVector, ops)
        sub_in = int_vector(tflite.SubGraphStartInputsVector, self.inputs)
        sub_out = int_vector(tflite.SubGraphStartOutputsVector, self.outputs)
        sub_name = b.CreateString("main")
        tflite.SubGraphStart(b)
        tflite.SubGraphAddTensors(b, sub_tensors)
        tflite.SubGraphAddInputs(b, sub_in)
        tflite.SubGraphAddOutputs(b, sub_out)
        tflite.SubGraphAddOperators(b, sub_ops)
        tflite.SubGraphAddName(b, sub_name)
        subgraph = tflite.SubGraphEnd(b)

        codes = []
        for builtin, custom in self._opcodes:
            custom_name = b.CreateString(custom) if custom else None
            tflite.OperatorCodeStart(b)
            # Old readers look at the int8 deprecated field, new ones at builtin_code.
            tflite.OperatorCodeAddDeprecatedBuiltinCode(b, min(builtin, 127))
            tflite.OperatorCodeAddBuiltinCode(b, builtin)
            tflite.OperatorCodeAddVersion(b, 1)
            if custom_name is not None:
                tflite.OperatorCodeAddCustomCode(b, custom_name)
            codes.append(tflite.OperatorCodeEnd(b))

        model_codes = table_vector(tflite.ModelStartOperatorCodesVector, codes)
        model_subgraphs = table_vector(tflite.ModelStartSubgraphsVector, [subgraph])
        model_buffers = table_vector(tflite.ModelStartBuffersVector, buffers)
        description = b.CreateString(self.description)
        tflite.ModelStart(b)
        tflite.ModelAddVersion(b, 3)
        tflite.ModelAddOperatorCodes(b, model_codes)
        tflite.ModelAddSubgraphs(b, model_subgraphs)
        tflite.ModelAddDescription(b, description)
        tflite.ModelAddBuffers(b, model_buffers)
        b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
        return bytes(b.Output())


# -- option writers (one per builtin we use) ---------------------------------------


def fully_connected_options(activation: int = tflite.ActivationFunctionType.NONE) -> tuple[int, OptionsWriter]:
    def write(b: flatbuffers.Builder) -> int:
        tflite.FullyConnectedOptionsStart(b)
        tflite.FullyConnectedOptionsAddFusedActivationFunction(b, activation)
        return tflite.FullyConnectedOptionsEnd(b)

    return tflite.BuiltinOptions.FullyConnectedOptions, write


def softmax_options(beta: float = 1.0) -> tuple[int, OptionsWriter]:
    def write(b: flatbuffers.Builder) -> int:
        tflite.SoftmaxOptionsStart(b)
        tflite.SoftmaxOptionsAddBeta(b, beta)
        return tflite.SoftmaxOptionsEnd(b)

    return tflite.BuiltinOptions.SoftmaxOptions, write


def conv2d_options(stride: int, activation: int, padding: int = tflite.Padding.SAME) -> tuple[int, OptionsWriter]:
    def write(b: flatbuffers.Builder) -> int:
        tflite.Conv2DOptionsStart(b)
        tflite.Conv2DOptionsAddPadding(b, padding)
        tflite.Conv2DOptionsAddStrideW(b, stride)
        tflite.Conv2DOptionsAddStrideH(b, stride)
        tflite.Conv2DOptionsAddFusedActivationFunction(b, activation)
        tflite.Conv2DOptionsAddDilationWFactor(b, 1)
        tflite.Conv2DOptionsAddDilationHFactor(b, 1)
        return tflite.Conv2DOptionsEnd(b)

    return tflite.BuiltinOptions.Conv2DOptions, write


def depthwise_options(stride: int, activation: int, padding: int = tflite.Padding.SAME) -> tuple[int, OptionsWriter]:
    def write(b: flatbuffers.Builder) -> int:
        tflite.DepthwiseConv2DOptionsStart(b)
        tflite.DepthwiseConv2DOptionsAddPadding(b, padding)
        tflite.DepthwiseConv2DOptionsAddStrideW(b, stride)
        tflite.DepthwiseConv2DOptionsAddStrideH(b, stride)
        tflite.DepthwiseConv2DOptionsAddDepthMultiplier(b, 1)
        tflite.DepthwiseConv2DOptionsAddFusedActivationFunction(b, activation)
        tflite.DepthwiseConv2DOptionsAddDilationWFactor(b, 1)
        tflite.DepthwiseConv2DOptionsAddDilationHFactor(b, 1)
        return tflite.DepthwiseConv2DOptionsEnd(b)

    return tflite.BuiltinOptions.DepthwiseConv2DOptions, write


def average_pool_options(size: int) -> tuple[int, OptionsWriter]:
    def write(b: flatbuffers.Builder) -> int:
        tflite.Pool2DOptionsStart(b)
        tflite.Pool2DOptionsAddPadding(b, tflite.Padding.VALID)
        tflite.Pool2DOptionsAddStrideW(b, size)
        tflite.Pool2DOptionsAddStrideH(b, size)
        tflite.Pool2DOptionsAddFilterWidth(b, size)
        tflite.Pool2DOptionsAddFilterHeight(b, size)
        return tflite.Pool2DOptionsEnd(b)

    return tflite.BuiltinOptions.Pool2DOptions, write


def reshape_options(new_shape: Sequence[int]) -> tuple[int, OptionsWriter]:
    def write(b: flatbuffers.Builder) -> int:
        tflite.ReshapeOptionsStartNewShapeVector(b, len(new_shape))
        for d in reversed(new_shape):
            b.PrependInt32(int(d))
        shape = b.EndVector()
        tflite.ReshapeOptionsStart(b)
        tflite.ReshapeOptionsAddNewShape(b, shape)
        return tflite.ReshapeOptionsEnd(b)

    return tflite.BuiltinOptions.ReshapeOptions, write


def arg_max_options(output_type: int = tflite.TensorType.INT32) -> tuple[int, OptionsWriter]:
    def write(b: flatbuffers.Builder) -> int:
        tflite.ArgMaxOptionsStart(b)
        tflite.ArgMaxOptionsAddOutputType(b, output_type)
        return tflite.ArgMaxOptionsEnd(b)

    return tflite.BuiltinOptions.ArgMaxOptions, write
