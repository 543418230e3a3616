"""An SSD-style detector ending in ``TFLite_Detection_PostProcess``, with a known answer.

Input: a 64x64 RGB uint8 image (real = pixel / 255), seen as a 4x4 grid of 16x16
cells, one anchor per cell. The graph has the shape of the published SSD models:

- class head: AVERAGE_POOL (each cell's mean colour) -> 1x1 CONV_2D (one logit per
  class, background first, by the rule in :mod:`.colours`) -> LOGISTIC -> RESHAPE to
  [1, 16, 4];
- box head: a 1x1 CONV_2D whose constant output is the box encoding (ty, tx, th, tw) =
  (0, 0, 5 ln 0.5, 5 ln 0.5) -> RESHAPE to [1, 16, 4];
- constant anchors [16, 4] (ycenter, xcenter, h, w): each cell's centre, twice its size,
  uint8 with scale 1/256 (exact); the kernel dequantizes anchors with the box encodings'
  type, so uint8 encodings need uint8 anchors, as in the published quantized SSDs;
- the custom op ``TFLite_Detection_PostProcess`` (LiteRT's builtin kernel, options in a
  FlexBuffer, as the converter writes them) decodes the boxes, runs NMS and outputs
  boxes [1, 10, 4] (ymin, xmin, ymax, xmax, normalized), classes [1, 10], scores [1, 10]
  and the count [1].

So an object of a class colour that fills one input cell is detected with that class,
a score near 1, and exactly that cell as its box (the encoding halves the anchor);
every other cell scores about 0.02, which the op still reports (its own score
threshold is 1e-8, as in real models): the runner's threshold must drop them.
"""

from __future__ import annotations

import math

import numpy as np
import tflite
from flatbuffers import flexbuffers

from . import colours
from .flatbuf import Graph, Quant, average_pool_options, conv2d_options, reshape_options

SIZE = 64
GRID = 4
CELL = SIZE // GRID
ANCHORS = GRID * GRID
MAX_DETECTIONS = 10
LABELS = colours.NAMES  # class ids 0, 1, 2 (the op drops the background class)
POSTPROCESS_OP = "TFLite_Detection_PostProcess"
# The box coder's scales (y, x, h, w) of the published SSD models.
SCALES = (10.0, 10.0, 5.0, 5.0)

_INPUT_Q = Quant.per_tensor(1 / 255, 0)
_SCORE_Q = Quant.per_tensor(1 / 256, 0)  # uint8 LOGISTIC output: fixed by the kernel
# Box encodings: th = tw = 5 ln 0.5 must be exact, so it is -100 steps from the zero point.
_BOX_Q = Quant.per_tensor(-SCALES[2] * math.log(0.5) / 100, 128)
_ANCHOR_Q = Quant.per_tensor(1 / 256, 0)


def anchors() -> np.ndarray:
    """[ANCHORS, 4] (ycenter, xcenter, h, w), normalized: cell centres, twice a cell's size."""
    rows = []
    for r in range(GRID):
        for c in range(GRID):
            rows.append(((r + 0.5) / GRID, (c + 0.5) / GRID, 2 / GRID, 2 / GRID))
    return np.asarray(rows, dtype=np.float32)


def cell_box(row: int, col: int) -> tuple[float, float, float, float]:
    """The normalized (ymin, xmin, ymax, xmax) the model reports for an object in a cell."""
    return row / GRID, col / GRID, (row + 1) / GRID, (col + 1) / GRID


def postprocess_options() -> bytes:
    """The op's FlexBuffer map, with the keys and types LiteRT's kernel reads."""
    y, x, h, w = SCALES
    return bytes(
        flexbuffers.Dumps(
            {
                "max_detections": MAX_DETECTIONS,
                "max_classes_per_detection": 1,
                "detections_per_class": 100,
                "use_regular_nms": False,
                "nms_score_threshold": 1e-8,
                "nms_iou_threshold": 0.6,
                "num_classes": len(LABELS),
                "y_scale": y,
                "x_scale": x,
                "h_scale": h,
                "w_scale": w,
            }
        )
    )


def _class_head(g: Graph, pooled: int) -> int:
    q_w, w_quant, q_b, b_quant = colours.quantized_logit_weights(True, _INPUT_Q.scale[0])
    weights = g.tensor("class/weights", q_w.shape, np.uint8, w_quant, q_w)
    bias = g.tensor("class/bias", q_b.shape, np.int32, b_quant, q_b)
    logits = g.tensor("class/logits", (1, GRID, GRID, len(q_b)), np.uint8, colours.LOGIT_Q)
    g.op(
        tflite.BuiltinOperator.CONV_2D,
        [pooled, weights, bias],
        [logits],
        *conv2d_options(1, tflite.ActivationFunctionType.NONE),
    )
    scores = g.tensor("class/scores", (1, GRID, GRID, len(q_b)), np.uint8, _SCORE_Q)
    g.op(tflite.BuiltinOperator.LOGISTIC, [logits], [scores])
    flat = g.tensor("class_predictions", (1, ANCHORS, len(q_b)), np.uint8, _SCORE_Q)
    g.op(tflite.BuiltinOperator.RESHAPE, [scores], [flat], *reshape_options((1, ANCHORS, len(q_b))))
    return flat


def _box_head(g: Graph, pooled: int) -> int:
    weights = g.tensor(
        "box/weights", (4, 1, 1, 3), np.uint8, Quant.per_tensor(1.0, 0), np.zeros((4, 1, 1, 3), dtype=np.uint8)
    )
    encoding = np.array([0.0, 0.0, SCALES[2] * math.log(0.5), SCALES[3] * math.log(0.5)])
    bias_scale = _INPUT_Q.scale[0] * 1.0
    bias = g.tensor(
        "box/bias", (4,), np.int32, Quant.per_tensor(bias_scale, 0), np.round(encoding / bias_scale).astype(np.int32)
    )
    encoded = g.tensor("box/encoded", (1, GRID, GRID, 4), np.uint8, _BOX_Q)
    g.op(
        tflite.BuiltinOperator.CONV_2D,
        [pooled, weights, bias],
        [encoded],
        *conv2d_options(1, tflite.ActivationFunctionType.NONE),
    )
    flat = g.tensor("box_encodings", (1, ANCHORS, 4), np.uint8, _BOX_Q)
    g.op(tflite.BuiltinOperator.RESHAPE, [encoded], [flat], *reshape_options((1, ANCHORS, 4)))
    return flat


def build_detector() -> bytes:
    """Serialised .tflite bytes of the detector."""
    g = Graph(description="slurm-tpu SSD-style colour detector")
    image = g.tensor("normalized_input_image_tensor", (1, SIZE, SIZE, 3), np.uint8, _INPUT_Q)
    pooled = g.tensor("cells", (1, GRID, GRID, 3), np.uint8, _INPUT_Q)
    g.op(tflite.BuiltinOperator.AVERAGE_POOL_2D, [image], [pooled], *average_pool_options(CELL))
    boxes_in, classes_in = _box_head(g, pooled), _class_head(g, pooled)
    anchor_tensor = g.tensor("anchors", (ANCHORS, 4), np.uint8, _ANCHOR_Q, np.round(anchors() * 256).astype(np.uint8))
    # Output names as the TF1 converter writes them (Coral's SSD models).
    outputs = [
        g.tensor("TFLite_Detection_PostProcess", (1, MAX_DETECTIONS, 4), np.float32),
        g.tensor("TFLite_Detection_PostProcess:1", (1, MAX_DETECTIONS), np.float32),
        g.tensor("TFLite_Detection_PostProcess:2", (1, MAX_DETECTIONS), np.float32),
        g.tensor("TFLite_Detection_PostProcess:3", (1,), np.float32),
    ]
    g.custom_op(POSTPROCESS_OP, [boxes_in, classes_in, anchor_tensor], outputs, postprocess_options())
    g.inputs, g.outputs = [image], outputs
    return g.serialize()


def label_lines() -> str:
    """The labels file in pycoral's ``<id> <label>`` format (as coco_labels.txt)."""
    return "".join(f"{i} {name}\n" for i, name in enumerate(LABELS))
