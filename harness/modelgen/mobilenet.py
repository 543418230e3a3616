"""A MobileNet-v1-shaped uint8 model: the workload of the seed cluster's jobs.

224x224x3 uint8 input, a 3x3 stride-2 conv, 13 depthwise-separable blocks, 7x7
average pool, FULLY_CONNECTED to 1001 classes (background + 1000, like the
published quantized MobileNets) and SOFTMAX. Weights are seeded random numbers,
scaled so that activations stay inside their ReLU6 quantization range; the model
classifies nothing meaningful (its scores vary with the input, its top-1 hardly:
deep random networks map most inputs alike), but it has the shape, size and cost of the real one
(about 570 M multiply-adds at width 1.0), which is what throughput work needs.
Building it takes well under a second and is byte-for-byte deterministic.
"""

from __future__ import annotations

import numpy as np
import tflite

from .flatbuf import (
    Graph,
    Quant,
    average_pool_options,
    conv2d_options,
    depthwise_options,
    fully_connected_options,
    softmax_options,
)

CLASSES = 1001
# (output channels at width 1.0, stride) of MobileNet v1's depthwise-separable blocks
_BLOCKS = [
    (64, 1),
    (128, 2),
    (128, 1),
    (256, 2),
    (256, 1),
    (512, 2),
    (512, 1),
    (512, 1),
    (512, 1),
    (512, 1),
    (512, 1),
    (1024, 2),
    (1024, 1),
]

# Activations after ReLU6 live in [0, 6]: one uint8 step is 6/255.
_ACT_Q = Quant.per_tensor(6 / 255, 0)
# MobileNet's input convention: real = (pixel - 128) / 128.
_INPUT_Q = Quant.per_tensor(1 / 128, 128)
_LOGIT_Q = Quant.per_tensor(16 / 255, 128)
_SCORE_Q = Quant.per_tensor(1 / 256, 0)
_RELU6 = tflite.ActivationFunctionType.RELU6
LOGIT_GAIN = 1.0


def _quantize_weights(w: np.ndarray) -> tuple[np.ndarray, Quant]:
    """Per-tensor asymmetric uint8 quantization (uint8 models have no per-channel scales)."""
    lo, hi = min(float(w.min()), 0.0), max(float(w.max()), 0.0)
    scale = (hi - lo) / 255 or 1.0
    zero = round(-lo / scale)
    q = np.clip(np.round(w / scale) + zero, 0, 255).astype(np.uint8)
    return q, Quant.per_tensor(scale, zero)


def _bias(g: Graph, name: str, values: np.ndarray, input_scale: float, weight_scale: float) -> int:
    scale = input_scale * weight_scale
    q = np.round(values / scale).astype(np.int32)
    return g.tensor(name, values.shape, np.int32, Quant.per_tensor(scale, 0), q)


class _Builder:
    def __init__(self, seed: int, width: float):
        self.g = Graph(description=f"slurm-tpu MobileNet-v1-shaped uint8 model, width {width}")
        self.rng = np.random.default_rng(seed)
        self.width = width
        self.n = 0

    def _weights(self, name: str, shape: tuple[int, ...], fan_in: int, gain: float = 1.8) -> tuple[int, float]:
        # Gain chosen so each layer's pre-activation has a spread of a few units:
        # ReLU6 neither saturates nor dies (checked layer by layer), so outputs
        # depend on the input.
        w = self.rng.normal(0.0, gain / np.sqrt(fan_in), size=shape).astype(np.float32)
        q, quant = _quantize_weights(w)
        return self.g.tensor(name, shape, np.uint8, quant, q), quant.scale[0]

    def conv(self, x: int, in_scale: float, out_ch: int, kernel: int, stride: int) -> int:
        self.n += 1
        _, h, w, in_ch = self.g.shape(x)
        weights, w_scale = self._weights(
            f"conv{self.n}/weights", (out_ch, kernel, kernel, in_ch), kernel * kernel * in_ch
        )
        bias = _bias(self.g, f"conv{self.n}/bias", self.rng.uniform(0.2, 1.0, out_ch), in_scale, w_scale)
        out = self.g.tensor(f"conv{self.n}/out", (1, -(-h // stride), -(-w // stride), out_ch), np.uint8, _ACT_Q)
        self.g.op(tflite.BuiltinOperator.CONV_2D, [x, weights, bias], [out], *conv2d_options(stride, _RELU6))
        return out

    def depthwise(self, x: int, in_scale: float, stride: int) -> int:
        self.n += 1
        _, h, w, ch = self.g.shape(x)
        weights, w_scale = self._weights(f"dw{self.n}/weights", (1, 3, 3, ch), 9)
        bias = _bias(self.g, f"dw{self.n}/bias", self.rng.uniform(0.2, 1.0, ch), in_scale, w_scale)
        out = self.g.tensor(f"dw{self.n}/out", (1, -(-h // stride), -(-w // stride), ch), np.uint8, _ACT_Q)
        self.g.op(
            tflite.BuiltinOperator.DEPTHWISE_CONV_2D, [x, weights, bias], [out], *depthwise_options(stride, _RELU6)
        )
        return out

    def build(self) -> bytes:
        g = self.g
        ch = lambda c: max(8, int(c * self.width))  # noqa: E731
        image = g.tensor("image", (1, 224, 224, 3), np.uint8, _INPUT_Q)
        x = self.conv(image, _INPUT_Q.scale[0], ch(32), 3, 2)
        for out_ch, stride in _BLOCKS:
            x = self.depthwise(x, _ACT_Q.scale[0], stride)
            x = self.conv(x, _ACT_Q.scale[0], ch(out_ch), 1, 1)
        _, h, _, c = g.shape(x)
        pooled = g.tensor("pool/out", (1, 1, 1, c), np.uint8, _ACT_Q)
        g.op(tflite.BuiltinOperator.AVERAGE_POOL_2D, [x], [pooled], *average_pool_options(h))
        # Pooled features share a large common part (every channel's mean activation);
        # rows summing to zero cancel it, so the logits follow what differs between
        # inputs rather than always crowning the same class.
        w = self.rng.normal(0.0, LOGIT_GAIN / np.sqrt(c), size=(CLASSES, c)).astype(np.float32)
        w -= w.mean(axis=1, keepdims=True)
        q, quant = _quantize_weights(w)
        weights, w_scale = g.tensor("logits/weights", (CLASSES, c), np.uint8, quant, q), quant.scale[0]
        bias = _bias(g, "logits/bias", np.zeros(CLASSES), _ACT_Q.scale[0], w_scale)
        logits = g.tensor("logits", (1, CLASSES), np.uint8, _LOGIT_Q)
        g.op(tflite.BuiltinOperator.FULLY_CONNECTED, [pooled, weights, bias], [logits], *fully_connected_options())
        scores = g.tensor("scores", (1, CLASSES), np.uint8, _SCORE_Q)
        g.op(tflite.BuiltinOperator.SOFTMAX, [logits], [scores], *softmax_options())
        g.inputs, g.outputs = [image], [scores]
        return g.serialize()


def build_mobilenet(width: float = 1.0, seed: int = 20240601) -> bytes:
    """Serialised .tflite bytes of the MobileNet-shaped model."""
    return _Builder(seed, width).build()


def labels() -> list[str]:
    """Class names in the published models' style: background first."""
    return ["background"] + [f"class_{i:04d}" for i in range(1, CLASSES)]
