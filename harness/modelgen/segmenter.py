"""A per-pixel colour segmenter (semantic segmentation with a known answer).

Input: a 32x32 RGB uint8 image (real = pixel / 255). A 1x1 CONV_2D gives each pixel
four logits: ``background`` (0) and ``red``, ``green``, ``blue`` by the rule in
:mod:`.colours`; so a pixel's class is its colour, or background when dark or grey.
Two variants, as published segmentation models come:

- ``build_segmenter()``: output [1, 32, 32, 4] uint8 logits (the runner takes the argmax);
- ``build_segmenter(argmax=True)``: an ARG_MAX at the end, output [1, 32, 32] int32 class ids.
"""

from __future__ import annotations

import numpy as np
import tflite

from . import colours
from .flatbuf import Graph, Quant, arg_max_options, conv2d_options

SIZE = 32
LABELS = ("background",) + colours.NAMES
_INPUT_Q = Quant.per_tensor(1 / 255, 0)


def build_segmenter(argmax: bool = False) -> bytes:
    """Serialised .tflite bytes of the segmenter."""
    g = Graph(description="slurm-tpu per-pixel colour segmenter" + (" (argmax)" if argmax else ""))
    image = g.tensor("image", (1, SIZE, SIZE, 3), np.uint8, _INPUT_Q)
    q_w, w_quant, q_b, b_quant = colours.quantized_logit_weights(True, _INPUT_Q.scale[0])
    weights = g.tensor("pixel/weights", q_w.shape, np.uint8, w_quant, q_w)
    bias = g.tensor("pixel/bias", q_b.shape, np.int32, b_quant, q_b)
    logits = g.tensor("logits", (1, SIZE, SIZE, len(LABELS)), np.uint8, colours.LOGIT_Q)
    g.op(
        tflite.BuiltinOperator.CONV_2D,
        [image, weights, bias],
        [logits],
        *conv2d_options(1, tflite.ActivationFunctionType.NONE),
    )
    output = logits
    if argmax:
        axis = g.tensor("argmax/axis", (1,), np.int32, None, np.array([3], dtype=np.int32))
        output = g.tensor("classes", (1, SIZE, SIZE), np.int32)
        g.op(tflite.BuiltinOperator.ARG_MAX, [logits, axis], [output], *arg_max_options())
    g.inputs, g.outputs = [image], [output]
    return g.serialize()


def expected_map(pixels: np.ndarray) -> np.ndarray:
    """The class map the segmenter must produce for [SIZE, SIZE, 3] uint8 pixels."""
    return colours.expected_classes(pixels, background=True)
