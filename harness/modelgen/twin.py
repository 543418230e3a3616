"""A "compiled" model whose Edge TPU executable is its CPU twin (TPU shards, issue 32).

``edgetpu_compiler`` turns a quantized model into one whose body is an ``edgetpu-custom-op``
node: its custom options are the executable the Edge TPU runs, its tensors the model's inputs
and outputs. No compiler and no silicon here, so :func:`twin_edgetpu_model` writes the same
shape with the quantized CPU model's own bytes as the "executable". Unmodified code that loads
it with ``load_delegate('libedgetpu.so.1')`` needs libedgetpu to claim that node (without the
delegate TFLite says the custom op is unresolved); on a TPU shard the node's patched libedgetpu
forwards the executable to the broker, which in twin mode (tests) runs it as the CPU model it is,
so the answers must equal the CPU model's, bit for bit.
"""

from __future__ import annotations

import tflite

from .flatbuf import _TENSOR_TYPES, Graph, Quant

_NUMPY = {value: dtype for dtype, value in _TENSOR_TYPES.items()}


def twin_edgetpu_model(cpu_model: bytes, description: str = "slurm-tpu twin-compiled model") -> bytes:
    """One ``edgetpu-custom-op`` from ``cpu_model``'s inputs to its outputs, the model's bytes its options."""
    model = tflite.Model.GetRootAsModel(cpu_model, 0)
    subgraph = model.Subgraphs(0)
    g = Graph(description=description)

    def copy(index: int) -> int:
        tensor = subgraph.Tensors(index)
        quant = None
        params = tensor.Quantization()
        if params is not None and params.ScaleLength():
            quant = Quant.per_tensor(float(params.Scale(0)), int(params.ZeroPoint(0)))
        shape = tuple(int(d) for d in tensor.ShapeAsNumpy())
        return g.tensor(tensor.Name().decode(), shape, _NUMPY[tensor.Type()], quant)

    inputs = [copy(subgraph.Inputs(i)) for i in range(subgraph.InputsLength())]
    outputs = [copy(subgraph.Outputs(i)) for i in range(subgraph.OutputsLength())]
    g.custom_op("edgetpu-custom-op", inputs, outputs, bytes(cpu_model))
    g.inputs, g.outputs = inputs, outputs
    return g.serialize()


def custom_options(compiled: bytes) -> bytes:
    """The first ``edgetpu-custom-op``'s options (the executable) of a compiled model."""
    model = tflite.Model.GetRootAsModel(compiled, 0)
    subgraph = model.Subgraphs(0)
    for i in range(subgraph.OperatorsLength()):
        operator = subgraph.Operators(i)
        code = model.OperatorCodes(operator.OpcodeIndex())
        if code.CustomCode() == b"edgetpu-custom-op":
            return operator.CustomOptionsAsNumpy().tobytes()
    raise ValueError("no edgetpu-custom-op in the model")
