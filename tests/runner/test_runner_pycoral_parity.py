"""pycoral parity: the runner's input tensors and results equal a plain LiteRT loop written
the way pycoral's examples do it (classify_image.py, detect_image.py, semantic_segmentation.py).

The loops below are deliberately naive transcriptions of those examples (PIL + numpy +
LiteRT's Interpreter, no slurm_tpu code), so a change in our preprocessing that moves
the tensor by one bit fails here.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from harness.modelgen import images
from slurm_tpu.runner import Runner, TaskOptions


def _interpreter(model):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(model), num_threads=1)
    interpreter.allocate_tensors()
    return interpreter


def _input_size(interpreter) -> tuple[int, int]:
    _, height, width, _ = interpreter.get_input_details()[0]["shape"]
    return int(width), int(height)


def _input_tensor(interpreter) -> np.ndarray:
    return interpreter.tensor(interpreter.get_input_details()[0]["index"])()[0]


def _output(interpreter, i: int) -> np.ndarray:
    return interpreter.get_tensor(interpreter.get_output_details()[i]["index"])


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """JPEGs of smooth colour fields (photo-like) in several sizes, and the detector's scenes as JPEG."""
    out = tmp_path_factory.mktemp("photos")
    paths = []
    for i, (w, h) in enumerate([(640, 480), (300, 500), (231, 173)]):
        rng = np.random.default_rng(i)
        y, x = np.mgrid[0:h, 0:w] / max(w, h)
        f = rng.uniform(1, 5, size=3)
        pixels = np.stack([np.sin(2 * np.pi * f[c] * (x + 0.3 * y) + c) * 110 + 128 for c in range(3)], -1)
        pixels += rng.normal(0, 8, pixels.shape)
        path = out / f"photo_{w}x{h}.jpg"
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path, quality=90)
        paths.append(path)
    scenes = [p for p, _ in images.write_scenes(out / "scenes", fmt="jpg")]
    return paths, scenes


def _classify_image_py(model, path, mean=None, std=None):
    """classify_image.py: LANCZOS from the full image; raw pixels unless mean/std say otherwise."""
    interpreter = _interpreter(model)
    image = Image.open(path).convert("RGB").resize(_input_size(interpreter), Image.LANCZOS)
    details = interpreter.get_input_details()[0]
    scale, zero_point = details["quantization"]
    if mean is None or (abs(scale * std - 1) < 1e-5 and abs(mean - zero_point) < 1e-5):
        _input_tensor(interpreter)[:, :] = image
    else:
        normalized = (np.asarray(image) - mean) / (std * scale) + zero_point
        np.clip(normalized, 0, 255, out=normalized)
        _input_tensor(interpreter)[:, :] = normalized.astype(np.uint8)
    tensor = _input_tensor(interpreter).copy()
    interpreter.invoke()
    return tensor, _output(interpreter, 0)


def test_classify_matches_classify_image_py(models, clean_env, photos):
    with Runner(str(models["mobilenet"]), environ=clean_env) as runner:
        for path in photos[0]:
            tensor, output = _classify_image_py(models["mobilenet"], path)
            mine = runner.prepare(str(path)).tensor
            assert mine.dtype == np.uint8 and np.array_equal(mine[0], tensor), path
            assert np.array_equal(runner.infer([mine])[0], output)
            scores = output[0].astype(np.float32)
            top = runner.run(str(path), TaskOptions(top_k=3))
            assert [c.index for c in top] == list(np.argsort(-scores, kind="stable")[:3])


def test_classify_normalisation_matches_input_mean_std(models, clean_env, photos):
    """With --input_mean/--input_std the model's own quantization is not enough: pycoral's formula."""
    from slurm_tpu.runner.preprocess import Normalization

    with Runner(str(models["classifier"]), environ=clean_env, normalization=Normalization(128.0, 128.0)) as runner:
        for path in photos[0]:
            tensor, output = _classify_image_py(models["classifier"], path, 128.0, 128.0)
            mine = runner.prepare(str(path)).tensor
            assert np.array_equal(mine[0], tensor)
            assert np.array_equal(runner.infer([mine])[0], output)


def _detect_image_py(model, path, threshold=0.4):
    """detect_image.py: set_resized_input (fit, LANCZOS, zero padding), then get_objects."""
    interpreter = _interpreter(model)
    image = Image.open(path)
    width, height = _input_size(interpreter)
    w, h = image.size
    scale = min(width / w, height / h)
    w, h = int(w * scale), int(h * scale)
    tensor = _input_tensor(interpreter)
    tensor.fill(0)
    tensor[:h, :w] = np.reshape(image.resize((w, h), Image.LANCZOS), (h, w, 3))
    copy = tensor.copy()
    del tensor  # pycoral holds no view across invoke() either
    interpreter.invoke()
    boxes, class_ids, scores = (_output(interpreter, i)[0] for i in range(3))
    count = int(_output(interpreter, 3)[0])
    sx, sy = width / scale, height / scale
    objects = []
    for i in range(count):
        if scores[i] >= threshold:
            ymin, xmin, ymax, xmax = boxes[i]
            objects.append(
                (int(class_ids[i]), float(scores[i]), (int(xmin * sx), int(ymin * sy), int(xmax * sx), int(ymax * sy)))
            )
    return copy, objects


@pytest.mark.parametrize("threshold", [0.4, 0.0])
def test_detect_matches_detect_image_py(models, clean_env, photos, threshold):
    with Runner(str(models["detector"]), environ=clean_env) as runner:
        for path in [*photos[1], *photos[0]]:
            tensor, objects = _detect_image_py(models["detector"], path, threshold)
            assert np.array_equal(runner.prepare(str(path)).tensor[0], tensor), path
            mine = runner.run(str(path), TaskOptions(threshold=threshold))
            assert [(o.id, o.score, o.bbox) for o in mine] == objects, path


def test_segment_matches_semantic_segmentation_py(models, clean_env, photos):
    """semantic_segmentation.py: full LANCZOS resize, argmax of the raw output; we then scale
    the map back to the source (nearest), which the example leaves at the input's size."""
    interpreter = _interpreter(models["segmenter"])
    with Runner(str(models["segmenter"]), environ=clean_env) as runner:
        for path in [*photos[1], *photos[0]]:
            image = Image.open(path)
            resized = image.resize(_input_size(interpreter), Image.LANCZOS)
            _input_tensor(interpreter)[:, :] = resized
            interpreter.invoke()
            result = np.argmax(_output(interpreter, 0)[0], axis=-1)
            assert np.array_equal(runner.prepare(str(path)).tensor[0], np.asarray(resized))
            back = np.asarray(Image.fromarray(result.astype(np.uint8)).resize(image.size, Image.NEAREST))
            assert np.array_equal(runner.run(str(path)).class_map, back), path


def test_fast_resize_is_opt_in_and_changes_the_tensor(models, clean_env, photos):
    big = str(photos[0][0])  # 640x480 JPEG: draft decoding kicks in
    with (
        Runner(str(models["mobilenet"]), environ=clean_env) as exact,
        Runner(str(models["mobilenet"]), environ=clean_env, fast_resize=True) as fast,
    ):
        assert not np.array_equal(exact.prepare(big).tensor, fast.prepare(big).tensor)
        assert np.array_equal(exact.prepare(big).tensor[0], _classify_image_py(models["mobilenet"], big)[0])
