"""The "brightest region" classifier: a real uint8 model with a known top-1.

Input: a 24x24 RGB uint8 image (real value = pixel / 255). The image is cut into
a 3x3 grid of 8x8 regions; FULLY_CONNECTED computes ten times each region's mean
brightness (one logit per region) and SOFTMAX turns the logits into scores. So the
top-1 class is, by construction, the brightest region - tests and the demo can
predict the answer for any image without a reference implementation.

The same graph is also written split in two segments (FC | SOFTMAX), the way
``edgetpu_compiler --num_segments=2`` splits a model for pipelining over 2 TPUs,
and with its FC replaced by ``edgetpu-custom-op`` (a model that claims to be
compiled for the Edge TPU, to exercise "Edge TPU model, no TPU" errors).
"""

from __future__ import annotations

import numpy as np
import tflite

from .flatbuf import Graph, Quant, fully_connected_options, softmax_options

SIZE = 24
GRID = 3
CELL = SIZE // GRID
LABELS = ["top-left", "top", "top-right", "left", "center", "right", "bottom-left", "bottom", "bottom-right"]
# Logits are LOGIT_RANGE * region mean in [0, 1]: wide enough for a sharp softmax.
LOGIT_RANGE = 10.0

_INPUT_Q = Quant.per_tensor(1 / 255, 0)
_LOGIT_Q = Quant.per_tensor(LOGIT_RANGE / 255, 0)
# uint8 softmax output must use scale 1/256, zero point 0 (TFLite kernel requirement).
_SCORE_Q = Quant.per_tensor(1 / 256, 0)


def region_masks() -> np.ndarray:
    """[classes, SIZE*SIZE*3] 0/1 masks: which flattened HWC pixels belong to each region."""
    masks = np.zeros((GRID * GRID, SIZE, SIZE, 3), dtype=np.uint8)
    for row in range(GRID):
        for col in range(GRID):
            masks[row * GRID + col, row * CELL : (row + 1) * CELL, col * CELL : (col + 1) * CELL, :] = 1
    return masks.reshape(GRID * GRID, -1)


def expected_top1(image: np.ndarray) -> int:
    """The class the model must predict for a [SIZE, SIZE, 3] uint8 image."""
    means = region_masks() @ image.reshape(-1).astype(np.float64)
    return int(np.argmax(means))


def _fc(g: Graph, image: int) -> int:
    """FULLY_CONNECTED: logits[c] = LOGIT_RANGE * mean(region c)."""
    fan_in = CELL * CELL * 3
    # Real weight LOGIT_RANGE / fan_in inside the region, stored as q=255 with zero point 0.
    weight_scale = LOGIT_RANGE / fan_in / 255
    weights = g.tensor(
        "fc/weights", (GRID * GRID, SIZE * SIZE * 3), np.uint8, Quant.per_tensor(weight_scale, 0), region_masks() * 255
    )
    bias = g.tensor(
        "fc/bias",
        (GRID * GRID,),
        np.int32,
        Quant.per_tensor(_INPUT_Q.scale[0] * weight_scale, 0),
        np.zeros(GRID * GRID, dtype=np.int32),
    )
    logits = g.tensor("logits", (1, GRID * GRID), np.uint8, _LOGIT_Q)
    g.op(tflite.BuiltinOperator.FULLY_CONNECTED, [image, weights, bias], [logits], *fully_connected_options())
    return logits


def _softmax(g: Graph, logits: int) -> int:
    scores = g.tensor("scores", (1, GRID * GRID), np.uint8, _SCORE_Q)
    g.op(tflite.BuiltinOperator.SOFTMAX, [logits], [scores], *softmax_options())
    return scores


def build_classifier() -> bytes:
    """The whole model: uint8 image -> FC -> SOFTMAX -> uint8 scores."""
    g = Graph(description="slurm-tpu brightest-region classifier")
    image = g.tensor("image", (1, SIZE, SIZE, 3), np.uint8, _INPUT_Q)
    scores = _softmax(g, _fc(g, image))
    g.inputs, g.outputs = [image], [scores]
    return g.serialize()


def build_classifier_segments() -> list[bytes]:
    """The same model as two pipeline segments: [image -> logits], [logits -> scores]."""
    first = Graph(description="slurm-tpu classifier segment 0 of 2")
    image = first.tensor("image", (1, SIZE, SIZE, 3), np.uint8, _INPUT_Q)
    first.inputs, first.outputs = [image], [_fc(first, image)]
    second = Graph(description="slurm-tpu classifier segment 1 of 2")
    logits = second.tensor("logits", (1, GRID * GRID), np.uint8, _LOGIT_Q)
    second.inputs, second.outputs = [logits], [_softmax(second, logits)]
    return [first.serialize(), second.serialize()]


def build_fake_edgetpu_classifier() -> bytes:
    """A model shaped like edgetpu_compiler output: its body is one ``edgetpu-custom-op``.

    No runtime can execute it without a real libedgetpu claiming that op; it exists
    so that tests can check what the runner does with Edge TPU models.
    """
    g = Graph(description="slurm-tpu classifier (fake Edge TPU compilation)")
    image = g.tensor("image", (1, SIZE, SIZE, 3), np.uint8, _INPUT_Q)
    logits = g.tensor("logits", (1, GRID * GRID), np.uint8, _LOGIT_Q)
    g.custom_op("edgetpu-custom-op", [image], [logits])
    scores = _softmax(g, logits)
    g.inputs, g.outputs = [image], [scores]
    return g.serialize()
