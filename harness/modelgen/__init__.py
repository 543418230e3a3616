"""Build the project's own .tflite models, labels and images (no TensorFlow, no downloads).

``python -m harness.modelgen --out DIR`` writes:

- ``classifier.tflite`` + ``classifier_labels.txt``: uint8 FC+SOFTMAX, top-1 = brightest
  of nine image regions (see :mod:`.classifier`);
- ``classifier_segment_{0,1}_of_2.tflite``: the same model split for a 2-TPU pipeline;
- ``classifier_edgetpu.tflite``: the same shape with an ``edgetpu-custom-op`` body;
- ``classifier_twin_edgetpu.tflite``, ``detector_twin_edgetpu.tflite``: the classifier and the
  detector "compiled" as one ``edgetpu-custom-op`` whose executable is the CPU model's own bytes
  (its CPU twin, see :mod:`.twin`): what unmodified code runs on a TPU shard in the tests;
- ``mobilenet_v1_224_quant.tflite`` + ``mobilenet_labels.txt``: MobileNet-v1-shaped uint8;
- ``detector.tflite`` + ``detector_labels.txt``: SSD-style, ending in
  ``TFLite_Detection_PostProcess``; finds red/green/blue objects (see :mod:`.detector`);
- ``segmenter.tflite`` (per-pixel logits) and ``segmenter_argmax.tflite`` (class map) +
  ``segmenter_labels.txt``: per-pixel colour classes (see :mod:`.segmenter`);
- ``images/``: generated PNGs with a known answer, ``images/expected.csv``;
- ``scenes/``: images of coloured objects of several sizes, ``scenes/expected.json``
  (each scene's size and objects as (class id, xmin, ymin, xmax, ymax) in pixels).
"""

from __future__ import annotations

import json
from pathlib import Path

from . import classifier, detector, images, mobilenet, segmenter, twin

__all__ = ["write_models", "classifier", "detector", "mobilenet", "segmenter", "images", "twin"]


def write_models(out: Path, image_count: int = 18, mobilenet_width: float = 1.0) -> dict[str, Path]:
    """Write every model, label file and ``image_count`` images under ``out``; returns the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "classifier": out / "classifier.tflite",
        "classifier_labels": out / "classifier_labels.txt",
        "classifier_edgetpu": out / "classifier_edgetpu.tflite",
        "classifier_twin_edgetpu": out / "classifier_twin_edgetpu.tflite",
        "detector_twin_edgetpu": out / "detector_twin_edgetpu.tflite",
        "mobilenet": out / "mobilenet_v1_224_quant.tflite",
        "mobilenet_labels": out / "mobilenet_labels.txt",
        "images": out / "images",
        "detector": out / "detector.tflite",
        "detector_labels": out / "detector_labels.txt",
        "segmenter": out / "segmenter.tflite",
        "segmenter_argmax": out / "segmenter_argmax.tflite",
        "segmenter_labels": out / "segmenter_labels.txt",
        "scenes": out / "scenes",
    }
    paths["classifier"].write_bytes(classifier.build_classifier())
    paths["classifier_labels"].write_text("\n".join(classifier.LABELS) + "\n")
    paths["classifier_edgetpu"].write_bytes(classifier.build_fake_edgetpu_classifier())
    for i, segment in enumerate(classifier.build_classifier_segments()):
        key = f"classifier_segment_{i}"
        paths[key] = out / f"classifier_segment_{i}_of_2.tflite"
        paths[key].write_bytes(segment)
    paths["mobilenet"].write_bytes(mobilenet.build_mobilenet(mobilenet_width))
    paths["mobilenet_labels"].write_text("\n".join(mobilenet.labels()) + "\n")
    paths["detector"].write_bytes(detector.build_detector())
    paths["classifier_twin_edgetpu"].write_bytes(
        twin.twin_edgetpu_model(paths["classifier"].read_bytes(), "slurm-tpu classifier (its CPU twin as Edge TPU op)")
    )
    paths["detector_twin_edgetpu"].write_bytes(
        twin.twin_edgetpu_model(paths["detector"].read_bytes(), "slurm-tpu detector (its CPU twin as Edge TPU op)")
    )
    paths["detector_labels"].write_text(detector.label_lines())
    paths["segmenter"].write_bytes(segmenter.build_segmenter())
    paths["segmenter_argmax"].write_bytes(segmenter.build_segmenter(argmax=True))
    paths["segmenter_labels"].write_text("\n".join(segmenter.LABELS) + "\n")
    scenes = images.write_scenes(paths["scenes"])
    (paths["scenes"] / "expected.json").write_text(
        json.dumps(
            {p.name: {"size": [s.width, s.height], "objects": [list(o) for o in s.objects]} for p, s in scenes},
            indent=1,
        )
        + "\n"
    )
    if image_count:
        written = images.write_images(paths["images"], image_count)
        (paths["images"] / "expected.csv").write_text("".join(f"{p.name},{label}\n" for p, label in written))
    return paths
