"""The colour rule shared by the generated detector and segmenter: a known answer by design.

Three classes, ``red``, ``green`` and ``blue``. For an area (a pixel, or a grid cell's
mean) with real channel values R, G, B in [0, 1], the logit of a colour is
``GAIN * (own - (other two) / 2) - OFFSET``: a saturated object of that colour gives
about +12 (score 0.99999 after a sigmoid), dark or grey areas about -4 (0.018), the
other two colours below -4. Swapping R and B (a BGR mix-up) turns red into blue, so
tests see channel-order mistakes.
"""

from __future__ import annotations

import numpy as np

from .flatbuf import Quant

NAMES = ("red", "green", "blue")
# Colours the generated images paint objects in (RGB), by class id.
PAINT = {0: (230, 25, 25), 1: (25, 230, 25), 2: (25, 25, 230)}
GAIN = 16.0
OFFSET = 4.0

# Weights in [-GAIN/2, GAIN]: uint8 with zero point 85 holds -8, 0 and 16 exactly.
WEIGHT_Q = Quant.per_tensor(1.5 * GAIN / 255, 85)
# Logits range from -GAIN - OFFSET (another colour at full strength) to GAIN - OFFSET.
LOGIT_Q = Quant.per_tensor(2 * GAIN / 255, 159)


def logit_weights(background: bool) -> tuple[np.ndarray, np.ndarray]:
    """Real (weights [classes, 3], biases [classes]); with a leading all-zero background class."""
    rows = [[GAIN if c == own else -GAIN / 2 for c in range(3)] for own in range(3)]
    biases = [-OFFSET] * 3
    if background:
        rows, biases = [[0.0, 0.0, 0.0]] + rows, [0.0] + biases
    return np.asarray(rows, dtype=np.float64), np.asarray(biases, dtype=np.float64)


def quantized_logit_weights(background: bool, input_scale: float) -> tuple[np.ndarray, Quant, np.ndarray, Quant]:
    """uint8 weights [classes, 1, 1, 3] and int32 biases for a 1x1 CONV_2D on uint8 pixels."""
    weights, biases = logit_weights(background)
    w_scale, w_zero = WEIGHT_Q.scale[0], WEIGHT_Q.zero_point[0]
    q = np.clip(np.round(weights / w_scale) + w_zero, 0, 255).astype(np.uint8)
    bias_scale = input_scale * w_scale
    qb = np.round(biases / bias_scale).astype(np.int32)
    return q.reshape(len(q), 1, 1, 3), WEIGHT_Q, qb, Quant.per_tensor(bias_scale, 0)


def expected_classes(pixels: np.ndarray, background: bool) -> np.ndarray:
    """Argmax class of each area of ``pixels`` [..., 3] uint8 (for checks; ties are avoided)."""
    weights, biases = logit_weights(background)
    logits = pixels.astype(np.float64) / 255 @ weights.T + biases
    return np.argmax(logits, axis=-1)
